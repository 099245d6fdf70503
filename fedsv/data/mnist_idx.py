"""Reader for the standard MNIST / Fashion-MNIST IDX files (plain or .gz), in torchvision's layout or flat."""

from __future__ import annotations

import gzip
import logging
import zlib
from pathlib import Path

import numpy as np

from fedsv.data.dataset import ArrayDataset

logger = logging.getLogger(__name__)

IDX_IMAGES_MAGIC = 0x00000803
"""Magic number of an IDX file of unsigned bytes with 3 dimensions (images)."""
IDX_LABELS_MAGIC = 0x00000801
"""Magic number of an IDX file of unsigned bytes with 1 dimension (labels)."""

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"

MNIST_NUM_CLASSES = 10


def idx_search_dirs(root: str | Path, subdir: str = "MNIST") -> list[Path]:
    """Directories searched for the IDX files: `<root>/<subdir>/raw` (torchvision's layout), then `<root>`."""
    base = Path(root)
    return [base / subdir / "raw", base]


def find_idx_file(root: str | Path, stem: str, subdir: str = "MNIST") -> Path:
    """Path of `stem` (or `stem.gz`) in the first search directory that holds it; plain files win over .gz."""
    dirs = idx_search_dirs(root, subdir)
    for directory in dirs:
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    searched = ", ".join(str(d) for d in dirs)
    raise FileNotFoundError(
        f"IDX file {stem} (or {stem}.gz) not found in {searched}; download MNIST there "
        "(e.g. torchvision.datasets.MNIST(root, download=True)) or pass the right data_dir"
    )


def _read_bytes(path: Path) -> bytes:
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"{path}: corrupt or truncated gzip file ({exc}); download it again") from exc


def read_idx(path: str | Path, expected_magic: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes: checks the magic number, big-endian dimensions and length."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file {path} does not exist; check the data directory")
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(
            f"{path}: truncated IDX file ({len(data)} bytes, no complete header); download it again"
        )
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}; "
            "this is not the expected MNIST images/labels file"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(data)} of {header} bytes); download it again")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims, dtype=np.int64))
    payload = len(data) - header
    if payload < expected:
        raise ValueError(
            f"{path}: truncated IDX file: header promises {dims} = {expected} bytes of data "
            f"but only {payload} follow; download it again"
        )
    if payload > expected:
        raise ValueError(
            f"{path}: {payload - expected} unexpected bytes after the {dims} IDX data; download it again"
        )
    return np.frombuffer(data, dtype=np.uint8, count=expected, offset=header).reshape(dims)


def read_idx_images(path: str | Path) -> np.ndarray:
    """uint8 images of shape (n, rows, cols) from an idx3-ubyte file."""
    return read_idx(path, IDX_IMAGES_MAGIC)


def read_idx_labels(path: str | Path) -> np.ndarray:
    """uint8 labels of shape (n,) from an idx1-ubyte file."""
    return read_idx(path, IDX_LABELS_MAGIC)


def load_idx_pair(images_path: str | Path, labels_path: str | Path, name: str) -> ArrayDataset:
    """One ArrayDataset of (n, 1, rows, cols) float32 in [0, 1] from an images file and its labels file."""
    images = read_idx_images(images_path)
    labels = read_idx_labels(labels_path)
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels; "
            "the files do not belong together"
        )
    n, rows, cols = images.shape
    x = images.reshape(n, 1, rows, cols).astype(np.float32) / np.float32(255.0)
    y = labels.astype(np.int64)
    if n and int(y.max()) >= MNIST_NUM_CLASSES:
        raise ValueError(f"{labels_path}: label {int(y.max())} is not a digit 0..9; wrong labels file?")
    logger.debug("read %d images of %dx%d from %s", n, rows, cols, images_path)
    return ArrayDataset(x=x, y=y, num_classes=MNIST_NUM_CLASSES, name=name)


def load_mnist_idx(
    root: str | Path, *, name: str = "mnist", subdir: str = "MNIST"
) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, test) from the four IDX files under `root` (see idx_search_dirs).

    Fashion-MNIST uses the same file names: pass its directory as `root` (or its parent with
    subdir="FashionMNIST").
    """
    if not Path(root).is_dir():
        raise FileNotFoundError(f"data directory {root} does not exist; pass the folder that holds MNIST")
    train = load_idx_pair(
        find_idx_file(root, TRAIN_IMAGES, subdir), find_idx_file(root, TRAIN_LABELS, subdir), name
    )
    test = load_idx_pair(
        find_idx_file(root, TEST_IMAGES, subdir), find_idx_file(root, TEST_LABELS, subdir), name
    )
    if train.input_shape != test.input_shape:
        raise ValueError(
            f"{name}: train images are {train.input_shape} but test images are {test.input_shape}"
        )
    return train, test
