"""Seeded data partitions (IID and the paper's label-sorted shards), computed locally by each participant."""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

PARTITION_SCHEMES: tuple[str, ...] = ("iid", "noniid")


def _check_labels(labels: np.ndarray) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {arr.shape}")
    return arr


def _iid(n: int, num_participants: int, rng: np.random.Generator) -> list[np.ndarray]:
    if n < num_participants:
        raise ValueError(
            f"iid partition needs at least one sample per participant: {n} samples < {num_participants}"
        )
    size = n // num_participants
    perm = rng.permutation(n).astype(np.int64)
    return [perm[i * size : (i + 1) * size].copy() for i in range(num_participants)]


def _noniid(
    labels: np.ndarray, num_participants: int, shards_per_participant: int, rng: np.random.Generator
) -> list[np.ndarray]:
    n = len(labels)
    num_shards = shards_per_participant * num_participants
    if n < num_shards:
        raise ValueError(
            f"noniid partition needs at least {num_shards} samples "
            f"({num_participants} participants x {shards_per_participant} shards), got {n}"
        )
    shard_size = n // num_shards
    # Shuffle first so that the stable sort breaks ties between equal labels at random.
    shuffled = rng.permutation(n).astype(np.int64)
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shard_ids = rng.permutation(num_shards)
    parts = []
    for rank in range(num_participants):
        mine = shard_ids[rank * shards_per_participant : (rank + 1) * shards_per_participant]
        parts.append(np.concatenate([by_label[s * shard_size : (s + 1) * shard_size] for s in mine]))
    return parts


def partition_indices(
    labels: np.ndarray,
    num_participants: int,
    scheme: str = "iid",
    seed: int = 0,
    shards_per_participant: int = 2,
) -> list[np.ndarray]:
    """Split range(len(labels)) among num_participants; deterministic from `seed`, parts disjoint.

    - "iid": a seeded permutation cut into equal parts of floor(n / N) (the remainder is unused).
    - "noniid" (McMahan et al.): sort by label (ties broken at random by the seed), cut into
      shards_per_participant * N shards of floor(n / (shards_per_participant * N)) samples, shuffle the
      shard ids and give each participant shards_per_participant shards.

    Returns one int64 index array per participant, in a deterministic (not sorted) order.
    """
    arr = _check_labels(labels)
    if num_participants < 1:
        raise ValueError(f"num_participants must be >= 1, got {num_participants}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    rng = np.random.default_rng(seed)
    key = scheme.lower().replace("-", "").replace("_", "")
    if key == "iid":
        parts = _iid(len(arr), num_participants, rng)
    elif key == "noniid":
        if shards_per_participant < 1:
            raise ValueError(f"shards_per_participant must be >= 1, got {shards_per_participant}")
        parts = _noniid(arr, num_participants, shards_per_participant, rng)
    else:
        raise ValueError(f"unknown partition scheme {scheme!r}; choose one of {list(PARTITION_SCHEMES)}")
    logger.debug(
        "%s partition of %d samples among %d participants: %d each",
        key,
        len(arr),
        num_participants,
        len(parts[0]),
    )
    return parts


def participant_indices(
    labels: np.ndarray,
    rank: int,
    world_size: int,
    scheme: str = "iid",
    seed: int = 0,
    shards_per_participant: int = 2,
) -> np.ndarray:
    """The indices of participant `rank` (0..world_size-1): partition_indices(...)[rank]."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in 0..{world_size - 1}, got {rank}")
    return partition_indices(labels, world_size, scheme, seed, shards_per_participant)[rank]
