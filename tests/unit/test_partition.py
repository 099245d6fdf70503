"""Seeded IID and label-sorted-shard partitions: disjoint, right sizes, deterministic, per-rank consistent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsv.data.partition import participant_indices, partition_indices


def sorted_labels(n: int = 1000, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n // classes).astype(np.int64)


def assert_disjoint(parts: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat)
    assert flat.min() >= 0 and flat.max() < n
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize("scheme", ["iid", "noniid"])
def test_sizes_disjoint_deterministic(scheme: str) -> None:
    labels = sorted_labels(1003 if scheme == "iid" else 1000)
    parts = partition_indices(labels, 7, scheme, seed=5)
    assert len(parts) == 7
    assert_disjoint(parts, len(labels))
    expected = len(labels) // 7 if scheme == "iid" else 2 * (len(labels) // 14)
    assert all(len(p) == expected for p in parts)
    again = partition_indices(labels, 7, scheme, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_indices(labels, 7, scheme, seed=6)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


@pytest.mark.parametrize("scheme", ["iid", "noniid"])
def test_participant_indices_matches_partition(scheme: str) -> None:
    labels = sorted_labels()
    parts = partition_indices(labels, 5, scheme, seed=2, shards_per_participant=3)
    for rank in range(5):
        mine = participant_indices(labels, rank, 5, scheme, seed=2, shards_per_participant=3)
        np.testing.assert_array_equal(mine, parts[rank])
    for bad in (-1, 5):
        with pytest.raises(ValueError, match=r"rank must lie in 0\.\.4"):
            participant_indices(labels, bad, 5, scheme, seed=2)


def test_noniid_participants_see_few_labels() -> None:
    labels = sorted_labels()
    parts = partition_indices(labels, 10, "noniid", seed=0)
    distinct = [len(np.unique(labels[p])) for p in parts]
    # Shards of 50 from 100-image classes never straddle two labels: at most 2 labels each.
    assert max(distinct) <= 2
    iid = partition_indices(labels, 10, "iid", seed=0)
    assert min(len(np.unique(labels[p])) for p in iid) >= 8


def test_noniid_breaks_ties_with_the_seed() -> None:
    labels = np.zeros(100, dtype=np.int64)
    a = partition_indices(labels, 2, "noniid", seed=0)
    b = partition_indices(labels, 2, "noniid", seed=1)
    assert not np.array_equal(np.sort(a[0]), np.sort(b[0]))


def test_invalid_arguments() -> None:
    labels = sorted_labels(20, 2)
    with pytest.raises(ValueError, match="num_participants must be >= 1"):
        partition_indices(labels, 0)
    with pytest.raises(ValueError, match="20 samples < 21"):
        partition_indices(labels, 21, "iid")
    with pytest.raises(ValueError, match="at least 22 samples"):
        partition_indices(labels, 11, "noniid")
    with pytest.raises(ValueError, match="unknown partition scheme"):
        partition_indices(labels, 2, "dirichlet")
    with pytest.raises(ValueError, match="shards_per_participant"):
        partition_indices(labels, 2, "noniid", shards_per_participant=0)
    with pytest.raises(ValueError, match="1-D"):
        partition_indices(labels.reshape(2, 10), 2)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 400),
    num=st.integers(-1, 40),
    scheme=st.sampled_from(["iid", "noniid"]),
    shards=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    classes=st.integers(1, 12),
)
def test_partition_property(n: int, num: int, scheme: str, shards: int, seed: int, classes: int) -> None:
    labels = np.random.default_rng(seed).integers(0, classes, size=n)
    needed = num if scheme == "iid" else num * shards
    if num < 1 or n < needed:
        with pytest.raises(ValueError):
            partition_indices(labels, num, scheme, seed, shards)
        return
    parts = partition_indices(labels, num, scheme, seed, shards)
    assert len(parts) == num
    assert_disjoint(parts, n)
    size = n // num if scheme == "iid" else shards * (n // (num * shards))
    assert all(len(p) == size for p in parts)
    assert n - sum(len(p) for p in parts) < (num if scheme == "iid" else num * shards)
    rank = seed % num
    np.testing.assert_array_equal(participant_indices(labels, rank, num, scheme, seed, shards), parts[rank])
