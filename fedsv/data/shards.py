"""Simulated participants: a rank's shard of one data set (partition and corruption), as a data source."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np

from fedsv.data import DATASET_NAMES, ArrayDataset, DatasetSplits, load_dataset
from fedsv.data.corruptions import Corruption, parse_corruption
from fedsv.data.partition import partition_indices
from fedsv.data.sources import Samples

_LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class Holdout:
    """What a run holds out of its data set for the coordinator (see load_dataset)."""

    validation_size: int
    validation_from: str  # "train" | "test": the files validation is cut from
    test_size: int  # 0: every test image not in validation


@functools.lru_cache(maxsize=4)
def _load_splits(dataset: str, data_dir: str, seed: int, holdout: Holdout) -> DatasetSplits:
    return load_dataset(
        dataset,
        data_dir or None,
        seed=seed,
        validation_size=holdout.validation_size,
        validation_from=holdout.validation_from,
        test_size=holdout.test_size,
    )


def cached_splits(dataset: str, data_dir: str, seed: int, holdout: Holdout) -> DatasetSplits:
    """The run's splits, loaded once per process (many ranks may share a process).

    The lock makes ranks that start together wait for the first load instead of each loading the
    data set at once (lru_cache alone does not hold concurrent callers back).
    """
    with _LOAD_LOCK:
        return _load_splits(dataset, data_dir, seed, holdout)


_PARTITIONS: dict[tuple[int, int, str, int], tuple[DatasetSplits, list[np.ndarray]]] = {}


def _partition(splits: DatasetSplits, world_size: int, partition: str, seed: int) -> list[np.ndarray]:
    """Every rank's indices into the training split, computed once per process: a process playing
    thousands of ranks would otherwise cut the whole split once per rank."""
    key = (id(splits), world_size, partition, seed)
    with _LOAD_LOCK:
        cached = _PARTITIONS.get(key)
        if cached is None or cached[0] is not splits:
            if len(_PARTITIONS) >= 4:
                _PARTITIONS.clear()
            cached = (splits, partition_indices(splits.train.y, world_size, partition, seed))
            _PARTITIONS[key] = cached
        return cached[1]


def load_shard(
    splits: DatasetSplits,
    rank: int,
    world_size: int,
    partition: str,
    seed: int,
    corruption_spec: str = "none",
) -> tuple[ArrayDataset, Corruption]:
    """The rank's part of the training split, with the corruption's changes to its data applied (fewer
    samples, flipped labels, another rank's part for a second identity); the corruption for training."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in 0..{world_size - 1}, got {rank}")
    corruption = parse_corruption(corruption_spec)
    owner = rank if corruption.copy_of is None else corruption.copy_of
    if not 0 <= owner < world_size:
        raise ValueError(f"corruption copy:{owner} names no rank; ranks are 0..{world_size - 1}")
    indices = _partition(splits, world_size, partition, seed)[owner]
    shard = splits.train.subset(indices)
    if corruption.label_flip_ratio > 0 or corruption.keep > 0 or corruption.made_up:
        shard = corruption.apply_to_dataset(shard, seed=seed + rank)
    return shard, corruption


SIMULATED = "simulated:"


def is_simulated(source: str) -> bool:
    """True for a data source of the form "simulated:DATASET" (a shard derived from the rank)."""
    return source.strip().startswith(SIMULATED)


@dataclass(frozen=True)
class Simulation:
    """The paper's setup as a data source: one named data set, split by seed, its training part cut into
    per-rank shards; "simulated:DATASET" names it (e.g. simulated:embedded, simulated:cifar10)."""

    dataset: str
    data_dir: str
    seed: int
    holdout: Holdout

    @classmethod
    def parse(cls, source: str, data_dir: str, seed: int, holdout: Holdout) -> Simulation:
        name = source.strip()[len(SIMULATED) :].strip().lower().replace("-", "_")
        if name not in DATASET_NAMES:
            raise ValueError(f"data source {source!r}: simulated data sets are {list(DATASET_NAMES)}")
        return cls(name, data_dir, seed, holdout)

    def splits(self) -> DatasetSplits:
        return cached_splits(self.dataset, self.data_dir, self.seed, self.holdout)

    def shard(
        self, rank: int, world_size: int, partition: str, corruption: str
    ) -> tuple[Samples, Corruption]:
        """The rank's shard of the training split (label flipping applied) and its corruption."""
        shard, parsed = load_shard(self.splits(), rank, world_size, partition, self.seed, corruption)
        return _samples(shard, f"simulated:{self.dataset} rank {rank}"), parsed

    def validation(self) -> Samples:
        return _samples(self.splits().validation, f"simulated:{self.dataset} validation")

    def test(self) -> Samples:
        return _samples(self.splits().test, f"simulated:{self.dataset} test")


def _samples(data: ArrayDataset, name: str) -> Samples:
    return Samples(x=data.x, y=data.y, name=name)
