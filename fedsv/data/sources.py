"""Standard data sources (npz, tables, image folders, IDX, CIFAR-10 batches) read as Samples by read_data."""

from __future__ import annotations

import re
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedsv.data.cifar10 import read_cifar10_batch
from fedsv.data.image_folder import IMAGE_SUFFIXES, read_image_folder
from fedsv.data.mnist_idx import read_idx_images, read_idx_labels
from fedsv.data.samples import DataError, Samples, require_file, wrap_error
from fedsv.data.tables import TABLE_SUFFIXES, read_table

__all__ = [
    "IMAGE_SUFFIXES",
    "SUPPORTED_FORMATS",
    "TABLE_SUFFIXES",
    "DataError",
    "Samples",
    "read_cifar10_samples",
    "read_data",
    "read_idx_samples",
    "read_image_folder",
    "read_npz",
    "read_table",
]

SUPPORTED_FORMATS = (
    "an .npz with arrays x and y, a .csv/.tsv/.parquet table (with --label COLUMN), "
    "an IDX images file (*images-idx3-ubyte[.gz]) beside its labels file, "
    "a CIFAR-10 batch (data_batch_N, test_batch) or a folder with one sub-folder of images per class"
)
"""What read_data reads, in words (for messages)."""

_CIFAR10_BATCH = re.compile(r"data_batch_\d+|test_batch")
_NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def read_data(path: str | Path, *, label: str | None = None, classes: Sequence[str] | None = None) -> Samples:
    """Samples from `path`, its format told by its name (see SUPPORTED_FORMATS).

    `label` names a table's label column (required for tables); `classes` gives the class names in label
    order for tables with string labels and for image folders. Both are ignored by the other formats.
    """
    file = Path(path)
    if not file.exists():
        raise DataError(f"{path}: no such file or folder")
    if file.is_dir():
        return read_image_folder(path, classes)
    suffix = file.suffix.lower()
    if suffix == ".npz":
        return read_npz(path)
    if suffix in TABLE_SUFFIXES:
        if label is None:
            raise DataError(f"{path}: a table needs --label COLUMN (the column that holds the class labels)")
        return read_table(path, label, classes)
    if "images-idx3-ubyte" in file.name:
        return read_idx_samples(path)
    if _CIFAR10_BATCH.fullmatch(file.name):
        return read_cifar10_samples(path)
    raise DataError(f"{path}: unsupported data format; read_data reads {SUPPORTED_FORMATS}")


def read_npz(path: str | Path) -> Samples:
    """Samples from the arrays "x" (numbers, (n, ...)) and "y" (integer labels, (n,)) of an .npz archive."""
    file = require_file(path)
    _check_zip_header(path, file)
    try:
        archive = np.load(file, allow_pickle=False)
    except _NPZ_ERRORS as exc:
        raise wrap_error(path, "cannot read as an .npz archive", exc) from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: not an .npz archive with arrays 'x' and 'y'")
    with archive:
        keys = sorted(archive.files)
        missing = [key for key in ("x", "y") if key not in keys]
        if missing:
            raise DataError(
                f"{path}: no array {missing[0]!r}; an .npz needs arrays 'x' and 'y', found {keys}"
            )
        try:
            x, y = archive["x"], archive["y"]
        except _NPZ_ERRORS as exc:
            raise wrap_error(path, "cannot read arrays 'x' and 'y'", exc) from exc
    return Samples(x=_npz_features(path, x), y=_npz_labels(path, y), name=str(path))


def _check_zip_header(path: str | Path, file: Path) -> None:
    """DataError unless the file starts like a zip archive (np.load would try other formats, pickle too)."""
    try:
        with file.open("rb") as f:
            magic = f.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise wrap_error(path, "cannot read", exc) from exc
    if magic.startswith(_NPY_MAGIC):
        raise DataError(f"{path}: holds a single .npy array, not an .npz archive with arrays 'x' and 'y'")
    if not magic.startswith(_ZIP_MAGIC):
        raise DataError(
            f"{path}: not an .npz archive (no zip header); write one with np.savez(path, x=x, y=y)"
        )


def _npz_features(path: str | Path, x: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "biuf":
        raise DataError(f"{path}: x has dtype {x.dtype}; features must be real numbers")
    with np.errstate(over="ignore"):  # values beyond float32 become inf, which Samples reports
        return x.astype(np.float32)


def _npz_labels(path: str | Path, y: np.ndarray) -> np.ndarray:
    if y.dtype.kind in "biu":
        return y.astype(np.int64)
    if y.dtype.kind != "f":
        raise DataError(f"{path}: y has dtype {y.dtype}; labels must be integers 0..K-1")
    bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{path}: label {y.flat[i]} (sample {i}) is not an integer; labels are class indices 0..K-1"
        )
    return y.astype(np.int64)


def read_idx_samples(path: str | Path) -> Samples:
    """Samples (n, 1, H, W) in [0, 1] from an IDX images file (e.g. train-images-idx3-ubyte or .gz) and the
    labels file beside it (the same name with "images-idx3" replaced by "labels-idx1")."""
    file = require_file(path)
    labels_file = _idx_labels_file(path, file)
    try:
        images = read_idx_images(file)
        labels = read_idx_labels(labels_file)
    except (OSError, ValueError) as exc:
        raise wrap_error(path, "cannot read the IDX files", exc) from exc
    if len(images) != len(labels):
        raise DataError(
            f"{path}: holds {len(images)} images but {labels_file.name} holds {len(labels)} labels; "
            "the files do not belong together"
        )
    x = images[:, None].astype(np.float32) / np.float32(255.0)
    return Samples(x=x, y=labels.astype(np.int64), name=str(path))


def _idx_labels_file(path: str | Path, file: Path) -> Path:
    """The labels file beside an IDX images file; with or without .gz if the exact sibling is absent."""
    if "images-idx3" not in file.name:
        raise DataError(
            f"{path}: an IDX images file name contains 'images-idx3'; cannot find its labels file"
        )
    sibling = file.with_name(file.name.replace("images-idx3", "labels-idx1"))
    other = sibling.with_name(sibling.name[:-3] if sibling.name.endswith(".gz") else f"{sibling.name}.gz")
    for candidate in (sibling, other):
        if candidate.is_file():
            return candidate
    raise DataError(f"{path}: its labels file {sibling.name} is not beside it")


def read_cifar10_samples(path: str | Path) -> Samples:
    """Samples (n, 3, 32, 32) in [0, 1] from one CIFAR-10 python batch (data_batch_N or test_batch)."""
    file = require_file(path)
    try:
        images, labels = read_cifar10_batch(file)
    except (OSError, ValueError) as exc:
        raise wrap_error(path, "cannot read as a CIFAR-10 batch", exc) from exc
    x = images.astype(np.float32) / np.float32(255.0)
    return Samples(x=x, y=labels, name=str(path))
