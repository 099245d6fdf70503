"""Data sets for fedsv: embedded MNIST sample, MNIST/Fashion-MNIST IDX, CIFAR-10; read_data for others."""

from fedsv.data.cifar10 import load_cifar10, read_cifar10_batch
from fedsv.data.dataset import ArrayDataset, DatasetSplits
from fedsv.data.embedded import EMBEDDED_SIZE, load_embedded
from fedsv.data.mnist_idx import (
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    load_mnist_idx,
    read_idx,
    read_idx_images,
    read_idx_labels,
)
from fedsv.data.registry import DATASET_NAMES, load_dataset
from fedsv.data.sources import (
    DataError,
    Samples,
    read_cifar10_samples,
    read_data,
    read_idx_samples,
    read_image_folder,
    read_npz,
    read_table,
)

__all__ = [
    "DATASET_NAMES",
    "EMBEDDED_SIZE",
    "IDX_IMAGES_MAGIC",
    "IDX_LABELS_MAGIC",
    "ArrayDataset",
    "DataError",
    "DatasetSplits",
    "Samples",
    "load_cifar10",
    "load_dataset",
    "load_embedded",
    "load_mnist_idx",
    "read_cifar10_batch",
    "read_cifar10_samples",
    "read_data",
    "read_idx",
    "read_idx_images",
    "read_idx_labels",
    "read_idx_samples",
    "read_image_folder",
    "read_npz",
    "read_table",
]
