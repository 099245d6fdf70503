"""In-memory image data sets: ArrayDataset (images + labels) and DatasetSplits (train/validation/test)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """Images `x` (float32, shape (n, C, H, W), values in [0, 1]) with labels `y` (int64, shape (n,)).

    Labels lie in 0..num_classes-1. The arrays are not copied; treat them as read-only.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.x, np.ndarray) or self.x.ndim != 4:
            shape = getattr(self.x, "shape", None)
            raise ValueError(f"{self.name}: x must be a numpy array of shape (n, C, H, W), got shape {shape}")
        if self.x.dtype != np.float32:
            raise ValueError(
                f"{self.name}: x must be float32, got {self.x.dtype}; convert with x.astype(np.float32)"
            )
        if not isinstance(self.y, np.ndarray) or self.y.ndim != 1:
            shape = getattr(self.y, "shape", None)
            raise ValueError(f"{self.name}: y must be a 1-D numpy array, got shape {shape}")
        if self.y.dtype != np.int64:
            raise ValueError(
                f"{self.name}: y must be int64, got {self.y.dtype}; convert with y.astype(np.int64)"
            )
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: x has {len(self.x)} images but y has {len(self.y)} labels")
        if self.num_classes < 1:
            raise ValueError(f"{self.name}: num_classes must be >= 1, got {self.num_classes}")
        if len(self.y) == 0:
            return
        lo, hi = int(self.y.min()), int(self.y.max())
        if lo < 0 or hi >= self.num_classes:
            raise ValueError(
                f"{self.name}: labels must lie in 0..{self.num_classes - 1}, found range {lo}..{hi}"
            )
        xmin, xmax = float(self.x.min()), float(self.x.max())
        if xmin < 0.0 or xmax > 1.0:
            raise ValueError(
                f"{self.name}: pixel values must lie in [0, 1], found range {xmin}..{xmax}; divide by 255"
            )

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        c, h, w = self.x.shape[1:]
        return int(c), int(h), int(w)

    def subset(self, indices: ArrayLike) -> ArrayDataset:
        """A new data set holding the images at `indices`, in that order (arrays are copied)."""
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise ValueError(f"{self.name}: subset indices must be 1-D, got shape {idx.shape}")
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"{self.name}: subset indices must be integers, got dtype {idx.dtype}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise ValueError(f"{self.name}: subset indices must lie in 0..{len(self) - 1}")
        return ArrayDataset(x=self.x[idx], y=self.y[idx], num_classes=self.num_classes, name=self.name)


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """The three disjoint splits: `train` (partitioned among participants), `validation` (used to
    compute data values) and `test` (held out for reporting accuracy)."""

    train: ArrayDataset
    validation: ArrayDataset
    test: ArrayDataset

    def __post_init__(self) -> None:
        shapes = {self.train.input_shape, self.validation.input_shape, self.test.input_shape}
        if len(shapes) != 1:
            raise ValueError(f"train/validation/test image shapes differ: {sorted(shapes)}")
        classes = {self.train.num_classes, self.validation.num_classes, self.test.num_classes}
        if len(classes) != 1:
            raise ValueError(f"train/validation/test num_classes differ: {sorted(classes)}")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.train.input_shape

    @property
    def num_classes(self) -> int:
        return self.train.num_classes
