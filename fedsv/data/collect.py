"""Arrays from what users hold labelled data in: (x, y), a torch Dataset, or a DataLoader of batches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LABEL_KEYS = ("label", "labels", "y", "target", "targets")
FEATURE_KEYS = ("img", "image", "images", "x", "pixel_values", "features", "input", "inputs")


def _array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is neither a tensor nor an array: {type(value).__name__}") from exc


def _pair(item: Any, what: str) -> tuple[Any, Any]:
    """(features, labels) of one sample or batch: a pair, or a mapping with a label key and one
    feature key (as Hugging Face datasets give Flower's examples, {"img": ..., "label": ...})."""
    if isinstance(item, Mapping):
        labels = [k for k in LABEL_KEYS if k in item]
        features = [k for k in FEATURE_KEYS if k in item] or [k for k in item if k not in LABEL_KEYS]
        if len(labels) != 1 or len(features) != 1:
            raise ValueError(
                f"{what} holds keys {sorted(map(str, item))}: expected one label key of {list(LABEL_KEYS)} "
                f"and one feature key (e.g. {list(FEATURE_KEYS[:4])})"
            )
        return item[features[0]], item[labels[0]]
    if isinstance(item, Sequence) and not isinstance(item, str | bytes) and len(item) == 2:
        return item[0], item[1]
    raise ValueError(f"{what} must be (features, labels) or a mapping of them, got {type(item).__name__}")


def labelled_arrays(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (n, ...), y int64 (n,)) from (x, y) of tensors or arrays, a torch Dataset of
    (features, label) samples, or a DataLoader (any iterable) of such batches; mappings with a label
    key and one feature key are read too. ValueError naming what does not fit."""
    if isinstance(data, DataLoader) or (
        isinstance(data, Iterable) and not isinstance(data, Sequence | Dataset)
    ):
        xs, ys = [], []
        for number, batch in enumerate(data):
            x, y = _pair(batch, f"batch {number}")
            xs.append(_array(x, f"batch {number}'s features"))
            ys.append(_array(y, f"batch {number}'s labels").reshape(-1))
        if not xs:
            raise ValueError("the data yielded no batch")
        return _checked(np.concatenate(xs), np.concatenate(ys))
    if isinstance(data, Dataset) and not isinstance(data, Sequence):
        samples = [_pair(data[i], f"sample {i}") for i in range(len(data))]  # type: ignore[arg-type]
        if not samples:
            raise ValueError("the dataset is empty")
        x = np.stack([_array(s[0], f"sample {i}'s features") for i, s in enumerate(samples)])
        y = np.array([int(_array(s[1], f"sample {i}'s label")) for i, s in enumerate(samples)])
        return _checked(x, y)
    x, y = _pair(data, "the data")
    return _checked(_array(x, "the features"), _array(y, "the labels").reshape(-1))


def _checked(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim < 2 or len(x) != len(y):
        raise ValueError(f"need features (n, ...) and labels (n,), got shapes {x.shape} and {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) and not np.all(np.equal(np.mod(y, 1), 0)):
        raise ValueError(f"labels must be whole class numbers, got {y.dtype}")
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)
