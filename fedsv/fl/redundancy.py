"""Redundant members of a round: updates far more alike than independent data give (one owner twice).

Two members that train on the same data send updates that differ only by their own shuffling of it;
members with data of their own differ by what their data differ in as well. Measured on the embedded
MNIST (10 members of about 300 images) and on scikit-learn's digits (8 owners of 30 to 200 images): a
copy's relative squared distance to its original, ||a - b||^2 / (||a||^2 + ||b||^2), was 0.01 to 0.06
of the round's median over all pairs, while no two members with data of their own came below 0.3 of
it (0.5 to 0.9 on IID shards), and a member holding half of another's images stood at 0.27 to 2.3.
A pair below REDUNDANT of the median is redundant; redundant pairs link into groups that the round's
game values as one player (fedsv.valuation.games.merged_game), so an owner that joins twice shares one
player's value instead of earning two. With two members there is no median to compare with: nothing
is merged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from fedsv.fl.distances import pairwise_distances

REDUNDANT = 0.15
"""A pair is redundant when its relative squared distance is below this share of the round's median
pair's (copies: 0.01 to 0.06; members with data of their own: 0.3 and up)."""


def delta_matrices(deltas: Sequence[Mapping[str, Tensor]]) -> list[Tensor]:
    """The deltas stacked per tensor, (m, numel) each (a round game holds them so already)."""
    return [torch.stack([d[name].reshape(-1) for d in deltas]) for name in deltas[0]]


def relative_distances(matrices: Sequence[Tensor], squared: Tensor | None = None) -> np.ndarray:
    """||a - b||^2 / (||a||^2 + ||b||^2) for every pair of the deltas whose tensors are the rows of
    `matrices`, (m, m) (0 where both are zero); `squared`: their pairwise squared distances where already
    computed (a selecting aggregation rule's)."""
    if squared is None:
        squared = pairwise_distances(list(matrices))
    distances = squared.to(torch.float64).cpu().numpy()
    norms = sum(matrix.to(torch.float64).pow(2).sum(dim=1) for matrix in matrices)
    lengths = np.asarray(torch.as_tensor(norms).cpu().numpy(), dtype=np.float64)
    scale = lengths[:, None] + lengths[None, :]
    return np.divide(distances, scale, out=np.zeros_like(distances), where=scale > 0)


def redundant_groups(
    matrices: Sequence[Tensor], squared: Tensor | None = None, share: float = REDUNDANT
) -> list[list[int]]:
    """The round's members (the rows of `matrices`, its deltas stacked per tensor) grouped by redundancy:
    pairs whose relative distance is below `share` of the median pair's, linked transitively; a member
    alone is a group of one. `squared`: the pairwise squared distances, where already computed."""
    m = int(matrices[0].shape[0])
    groups = [[i] for i in range(m)]
    if m < 3:
        return groups
    relative = relative_distances(matrices, squared)
    pairs = np.triu_indices(m, 1)
    median = float(np.median(relative[pairs]))
    if not median > 0:
        return groups
    parent = list(range(m))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in zip(pairs[0].tolist(), pairs[1].tolist(), strict=True):
        if relative[a, b] < share * median:
            parent[root(b)] = root(a)
    linked: dict[int, list[int]] = {}
    for member in range(m):
        linked.setdefault(root(member), []).append(member)
    return sorted(linked.values())


def counted_once(deltas: Sequence[Mapping[str, Tensor]], counts: Sequence[float]) -> list[float]:
    """The members' sample counts with each redundant group of the deltas weighing as one member (the
    coordinator's aggregation; a round's game takes the same groups: weighed_once)."""
    return weighed_once(redundant_groups(delta_matrices(deltas)) if deltas else [], counts)


def weighed_once(groups: Sequence[Sequence[int]], counts: Sequence[float]) -> list[float]:
    """Each member's count divided by the size of its group in `groups` (members of no group: alone)."""
    size = {member: len(group) for group in groups for member in group}
    return [float(count) / size.get(i, 1) for i, count in enumerate(counts)]
