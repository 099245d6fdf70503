"""A rank's local shard: the run's data split, the rank's partition, and the rank's corruption."""

from __future__ import annotations

import functools
import threading

from fedsv.common.corruptions import Corruption, parse_corruption
from fedsv.common.data import ArrayDataset, DatasetSplits, load_dataset
from fedsv.common.partition import participant_indices

_LOAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _load_splits(dataset: str, data_dir: str, seed: int, validation_size: int) -> DatasetSplits:
    return load_dataset(dataset, data_dir or None, seed=seed, validation_size=validation_size)


def cached_splits(dataset: str, data_dir: str, seed: int, validation_size: int) -> DatasetSplits:
    """The run's splits, loaded once per process (many ranks may share a process).

    The lock makes ranks that start together wait for the first load instead of each loading the
    data set at once (lru_cache alone does not hold concurrent callers back).
    """
    with _LOAD_LOCK:
        return _load_splits(dataset, data_dir, seed, validation_size)


def load_shard(
    splits: DatasetSplits,
    rank: int,
    world_size: int,
    partition: str,
    seed: int,
    corruption_spec: str = "none",
) -> tuple[ArrayDataset, Corruption]:
    """The rank's part of the training split, with label flipping applied; the corruption for training."""
    indices = participant_indices(splits.train.y, rank, world_size, partition, seed)
    shard = splits.train.subset(indices)
    corruption = parse_corruption(corruption_spec)
    if corruption.label_flip_ratio > 0:
        shard = corruption.apply_to_dataset(shard, seed=seed + rank)
    return shard, corruption
