"""Reader for the CIFAR-10 "python version" pickle batches (data_batch_1..5 and test_batch)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from fedsv.data.dataset import ArrayDataset

logger = logging.getLogger(__name__)

CIFAR10_SUBDIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
CIFAR10_NUM_CLASSES = 10
_PIXELS = 3 * 32 * 32

# The batches hold a dict of bytes, lists and one numpy array; nothing else may be unpickled.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}


class _BatchUnpickler(pickle.Unpickler):
    """pickle.Unpickler that only resolves the globals a CIFAR-10 batch needs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch")
        return super().find_class(module, name)


def find_cifar10_file(root: str | Path, filename: str) -> Path:
    """Path of `filename` in `<root>/cifar-10-batches-py/` or directly in `<root>`."""
    base = Path(root)
    dirs = [base / CIFAR10_SUBDIR, base]
    for directory in dirs:
        candidate = directory / filename
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(d) for d in dirs)
    raise FileNotFoundError(
        f"CIFAR-10 batch {filename} not found in {searched}; extract cifar-10-python.tar.gz there "
        "or pass the right data_dir"
    )


def _get(batch: dict[Any, Any], key: str) -> Any:
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise KeyError(key)


def read_cifar10_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (n, 3, 32, 32) and int64 labels (n,) from one pickled batch."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR-10 batch {path} does not exist; check the data directory")
    try:
        with path.open("rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable CIFAR-10 python batch ({exc}); download it again") from exc
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(batch).__name__}; wrong file?")
    try:
        data = np.asarray(_get(batch, "data"))
        labels = np.asarray(_get(batch, "labels"))
    except KeyError as exc:
        raise ValueError(f"{path}: batch has no {exc.args[0]!r} entry; wrong file?") from exc
    if data.ndim != 2 or data.shape[1] != _PIXELS or data.dtype != np.uint8:
        raise ValueError(f"{path}: data must be uint8 of shape (n, {_PIXELS}), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{path}: expected {data.shape[0]} integer labels, got {labels.dtype} of shape {labels.shape}"
        )
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= CIFAR10_NUM_CLASSES):
        raise ValueError(f"{path}: labels must lie in 0..9, found {int(labels.min())}..{int(labels.max())}")
    # Each row is 1024 red, 1024 green, then 1024 blue values, each plane row-major 32x32.
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _to_dataset(parts: list[tuple[np.ndarray, np.ndarray]], name: str) -> ArrayDataset:
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    x = images.astype(np.float32) / np.float32(255.0)
    return ArrayDataset(x=x, y=labels, num_classes=CIFAR10_NUM_CLASSES, name=name)


def load_cifar10(root: str | Path, *, name: str = "cifar10") -> tuple[ArrayDataset, ArrayDataset]:
    """(train, test): data_batch_1..5 in order, and test_batch; float32 (n, 3, 32, 32) in [0, 1]."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"data directory {root} does not exist; pass the folder that holds CIFAR-10")
    train_paths = [find_cifar10_file(root, f) for f in TRAIN_BATCHES]
    test_path = find_cifar10_file(root, TEST_BATCH)
    train = _to_dataset([read_cifar10_batch(p) for p in train_paths], name)
    test = _to_dataset([read_cifar10_batch(test_path)], name)
    logger.debug("read CIFAR-10 from %s: %d train, %d test images", root, len(train), len(test))
    return train, test
