"""Aggregation rules (FedAvg and robust ones), for the coordinator and for every coalition of its game."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedsv.fl.distances import pairwise_distances
from fedsv.fl.redundancy import counted_once
from fedsv.fl.state import apply_delta, fedavg
from fedsv.fl.updates import ClientUpdate

RULES = ("fedavg", "uniform", "median", "trimmed_mean", "krum", "multi_krum")
COORDINATEWISE = ("median", "trimmed_mean")
"""Rules that are not a weighted sum of the deltas: their round games take the batched path."""


@dataclass(frozen=True)
class AggregationRule:
    """How a set S of deltas becomes the round's update.

    fedavg: mean weighted by sample counts; uniform: plain mean.
    median: coordinate-wise median (the mean of the two middle values for an even count).
    trimmed_mean: coordinate-wise mean after dropping floor(trim * |S|) values at each end.
    krum: the delta whose summed squared distance to its |S| - byzantine - 2 nearest others in S is
        smallest (Blanchard et al. 2017); multi_krum: the FedAvg of the `keep` best by that score
        (keep 0: |S| - byzantine). Both select, then average linearly, so their games keep the fast path.
    once: redundant members (fedsv.fl.redundancy: updates far more alike than independent data give, one
        owner's data twice) weigh as one member: each one's sample count divided by its group's size
        (fedavg, krum, multi_krum; the other rules take no counts), in the round and in its game.
    """

    name: str = "fedavg"
    trim: float = 0.1
    byzantine: int = 1
    keep: int = 0
    once: bool = False

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise ValueError(f"aggregation must be one of {list(RULES)}, got {self.name!r}")
        if not (math.isfinite(self.trim) and 0 <= self.trim < 0.5):
            raise ValueError(f"aggregation_trim must be in [0, 0.5), got {self.trim}")
        if self.byzantine < 0 or self.keep < 0:
            raise ValueError(
                f"aggregation_byzantine and aggregation_keep must be >= 0, got {self.byzantine}, {self.keep}"
            )

    @property
    def coordinatewise(self) -> bool:
        return self.name in COORDINATEWISE

    @property
    def selects(self) -> bool:
        return self.name in ("krum", "multi_krum")

    def coefficients(self, members: Tensor, counts: Tensor, distances: Tensor | None = None) -> Tensor:
        """Per coalition (rows of the bool matrix `members`, (B, m)) the weights c with update c @ deltas;
        zero rows for the empty coalition. For linear and selecting rules only."""
        if self.coordinatewise:
            raise ValueError(f"{self.name} is not a weighted sum of the deltas")
        weights = counts if self.name in ("fedavg", "krum", "multi_krum") else torch.ones_like(counts)
        chosen = members
        if self.selects:
            if distances is None:
                raise ValueError(f"{self.name} needs the deltas' pairwise distances")
            chosen = self._selected(members, distances)
        weighted = chosen.to(weights.dtype) * weights
        totals = weighted.sum(dim=1, keepdim=True)
        return torch.where(totals > 0, weighted / totals.clamp_min(torch.finfo(totals.dtype).tiny), 0.0)

    def _selected(self, members: Tensor, distances: Tensor) -> Tensor:
        """Per coalition, the members Krum (one) or Multi-Krum (`keep`) selects."""
        m = members.shape[1]
        sizes = members.sum(dim=1)
        # d[b, i, j]: distance from i to j when both are in coalition b, else +inf (i never its own neighbour)
        inf = torch.tensor(math.inf, dtype=distances.dtype, device=distances.device)
        both = (
            members[:, :, None] & members[:, None, :] & ~torch.eye(m, dtype=torch.bool, device=members.device)
        )
        d = torch.where(both, distances[None], inf)
        nearest = torch.sort(d, dim=2).values  # (B, m, m): each member's distances, nearest first
        closest = (sizes - self.byzantine - 2).clamp(min=1)  # Flower: max(1, n - f - 2)
        take = torch.arange(m, device=members.device)[None, None, :] < closest[:, None, None]
        finite = torch.where(take & torch.isfinite(nearest), nearest, torch.zeros_like(nearest))
        scores = torch.where(members, finite.sum(dim=2), inf)  # non-members never selected
        keep = torch.ones_like(sizes) if self.name == "krum" else self._keep(sizes)
        ranks = torch.argsort(torch.argsort(scores, dim=1, stable=True), dim=1)  # rank of each member's score
        return members & (ranks < keep[:, None])

    def _keep(self, sizes: Tensor) -> Tensor:
        if self.keep > 0:
            return torch.minimum(sizes, torch.full_like(sizes, self.keep)).clamp(min=1)
        return (sizes - self.byzantine).clamp(min=1)

    def combine(self, members: Tensor, matrix: Tensor) -> Tensor:
        """Coordinate-wise rules: per coalition (B, m) bool, the aggregate (B, P) of `matrix` (m, P)'s rows
        that are members; zeros for the empty coalition."""
        sizes = members.sum(dim=1)  # (B,)
        inf = torch.tensor(math.inf, dtype=matrix.dtype, device=matrix.device)
        values = torch.where(members[:, :, None], matrix[None], inf)
        ordered = torch.sort(values, dim=1).values  # members first (ascending), non-members (+inf) last
        ordered = torch.where(torch.isfinite(ordered), ordered, torch.zeros((), dtype=matrix.dtype))
        k = sizes.clamp(min=1)
        if self.name == "median":
            low = ((k - 1) // 2)[:, None, None].expand(-1, 1, matrix.shape[1])
            high = (k // 2)[:, None, None].expand(-1, 1, matrix.shape[1])
            middle = 0.5 * (ordered.gather(1, low) + ordered.gather(1, high))
            out = middle[:, 0]
        else:  # trimmed mean
            cut = torch.floor(self.trim * k.to(torch.float64)).to(torch.long)
            sums = torch.cumsum(ordered, dim=1)
            zero = torch.zeros(
                (members.shape[0], 1, matrix.shape[1]), dtype=matrix.dtype, device=matrix.device
            )
            sums = torch.cat([zero, sums], dim=1)  # sums[:, j] = sum of the j smallest
            upper = (k - cut)[:, None, None].expand(-1, 1, matrix.shape[1])
            lower = cut[:, None, None].expand(-1, 1, matrix.shape[1])
            out = ((sums.gather(1, upper) - sums.gather(1, lower)) / (k - 2 * cut)[:, None, None])[:, 0]
        return torch.where(sizes[:, None] > 0, out, torch.zeros_like(out))


FEDAVG = AggregationRule()


def ordered_updates(updates: Sequence[ClientUpdate], number: int) -> list[ClientUpdate]:
    """The updates in participant-id order, whatever order they arrived in."""
    if not updates:
        raise ValueError(f"round {number}: no updates to aggregate")
    return sorted(updates, key=lambda u: u.participant)


def aggregate(
    params: Mapping[str, Tensor],
    updates: Sequence[ClientUpdate],
    number: int,
    rule: AggregationRule = FEDAVG,
) -> dict[str, Tensor]:
    """w_{t+1} = w_t + the rule's aggregate of the round's updates (FedAvg: weighted by sample counts)."""
    ordered = ordered_updates(updates, number)
    counts: list[float] = [float(u.num_samples) for u in ordered]
    if rule.once:
        counts = counted_once([u.delta for u in ordered], counts)
    if rule.name == "fedavg":
        return apply_delta(params, fedavg([u.delta for u in ordered], counts))
    return apply_delta(params, robust_aggregate(rule, [u.delta for u in ordered], counts))


def robust_aggregate(
    rule: AggregationRule, deltas: Sequence[Mapping[str, Tensor]], counts: Sequence[float]
) -> dict[str, Tensor]:
    """The rule's aggregate of all the deltas, computed in float64 as the round game computes a coalition."""
    names = list(deltas[0])
    matrices = {n: torch.stack([d[n].reshape(-1).to(torch.float64) for d in deltas]) for n in names}
    everyone = torch.ones((1, len(deltas)), dtype=torch.bool)
    if rule.coordinatewise:
        flat = {n: rule.combine(everyone, matrix)[0] for n, matrix in matrices.items()}
    else:
        distances = pairwise_distances(list(matrices.values())) if rule.selects else None
        weights = torch.tensor([float(c) for c in counts], dtype=torch.float64)
        coeffs = rule.coefficients(everyone, weights, distances)
        flat = {n: (coeffs @ matrix)[0] for n, matrix in matrices.items()}
    return {n: flat[n].reshape(deltas[0][n].shape).to(deltas[0][n].dtype) for n in names}
