"""Samples (features + integer class labels read from a data source) and DataError, a one-line read error."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike


class DataError(ValueError):
    """A data file or folder that cannot be read as samples; the message is ONE line naming the path and what
    is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


def require_file(path: str | Path) -> Path:
    """`path` as a Path; DataError when it is not an existing file."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{path}: no such file or folder")
    if not p.is_file():
        raise DataError(f"{path}: not a file")
    return p


def wrap_error(path: str | Path, what: str, exc: BaseException) -> DataError:
    """A DataError for `exc`, raised while reading `path`: '<path>: <what>: <exc>' on one line (a leading
    '<path>: ' in the message of `exc` is dropped)."""
    detail = str(exc) or type(exc).__name__
    detail = detail.removeprefix(f"{Path(path)}: ")
    return DataError(f"{path}: {what}: {detail}")


@dataclass(frozen=True, eq=False)
class Samples:
    """x: float32 array (n, ...) of features (any trailing shape: tabular (n, d), images (n, C, H, W));
    y: int64 array (n,) of class labels >= 0; name: where they came from (for messages).

    The arrays are not copied; treat them as read-only.
    """

    x: np.ndarray
    y: np.ndarray
    name: str

    def __post_init__(self) -> None:
        self._check_x()
        self._check_y()
        if len(self.x) != len(self.y):
            raise DataError(f"{self.name}: x has {len(self.x)} samples but y has {len(self.y)} labels")
        if len(self.y) == 0:
            raise DataError(f"{self.name}: no samples")
        if not np.isfinite(self.x).all():
            first = int(np.argwhere(~np.isfinite(self.x.reshape(len(self.x), -1)))[0, 0])
            raise DataError(f"{self.name}: features hold NaN or infinite values (first in sample {first})")
        lo = int(self.y.min())
        if lo < 0:
            raise DataError(f"{self.name}: labels must be >= 0, found {lo}")

    def _check_x(self) -> None:
        if not isinstance(self.x, np.ndarray) or self.x.ndim < 2:
            shape = getattr(self.x, "shape", None)
            raise DataError(
                f"{self.name}: x must be a numpy array of shape (n, ...) with ndim >= 2, got {shape}"
            )
        if self.x.dtype != np.float32:
            raise DataError(f"{self.name}: x must be float32, got {self.x.dtype}")

    def _check_y(self) -> None:
        if not isinstance(self.y, np.ndarray) or self.y.ndim != 1:
            shape = getattr(self.y, "shape", None)
            raise DataError(f"{self.name}: y must be a 1-D numpy array, got shape {shape}")
        if self.y.dtype != np.int64:
            raise DataError(f"{self.name}: y must be int64, got {self.y.dtype}")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def num_classes(self) -> int:
        """Largest label + 1."""
        return int(self.y.max()) + 1

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one sample's features: (d,) for a table, (C, H, W) for images."""
        return tuple(int(s) for s in self.x.shape[1:])

    def subset(self, indices: ArrayLike) -> Samples:
        """New Samples holding the samples at `indices`, in that order (arrays are copied)."""
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise DataError(f"{self.name}: subset indices must be 1-D, got shape {idx.shape}")
        if idx.size == 0:
            raise DataError(f"{self.name}: subset indices are empty; Samples cannot be empty")
        if not np.issubdtype(idx.dtype, np.integer):
            raise DataError(f"{self.name}: subset indices must be integers, got dtype {idx.dtype}")
        if int(idx.min()) < 0 or int(idx.max()) >= len(self):
            raise DataError(f"{self.name}: subset indices must lie in 0..{len(self) - 1}")
        return Samples(x=self.x[idx], y=self.y[idx], name=self.name)


def check_classes(path: str | Path, classes: Sequence[str]) -> list[str]:
    """`classes` as a list of distinct names; DataError (naming `path`) for one string, none or duplicates."""
    if isinstance(classes, str):
        raise DataError(f"{path}: classes must be a list of class names, not the one string {classes!r}")
    names = [str(c) for c in classes]
    if not names:
        raise DataError(f"{path}: classes is empty; pass the class names in label order")
    dupes = sorted(n for n, count in Counter(names).items() if count > 1)
    if dupes:
        raise DataError(f"{path}: classes lists {dupes} more than once")
    return names
