"""The guard's direction check: each update's cosines with the referee's descent and with the FedAvg of
the round's other updates, the updates that work against both (`direction_outliers`), and which
clipped updates clip-or-reject keeps (`clippable`: a data-rich member's larger step along the descent).

update_guard runs these in its third step; the tolerance they compare against is what the guard's memory
learned of this federation's honest updates (`GuardMemory.tolerance`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from fedsv.fl.referee import Referee
from fedsv.fl.state import fedavg
from fedsv.fl.update_bounds import BoundedUpdates
from fedsv.fl.updates import ClientUpdate, flat_delta

MARGIN = 0.05
"""How far below 0 a cosine must lie to count against an update (and, for clip-or-reject's clipped
updates, how far above 0 to count for one: a random direction in a model's space has a cosine near 0)."""


def _cosine(a: Tensor, b: Tensor) -> float:
    norm = float(a.norm() * b.norm())
    return float(a @ b) / norm if norm > 0 else 0.0


def _descent_cosine(update: ClientUpdate, descent: Mapping[str, Tensor], reference: Tensor) -> float:
    """An update's cosine with the referee's descent (`reference`: the descent flattened), over the
    descent's parameters."""
    return _cosine(flat_delta({n: update.delta[n] for n in descent}), reference)


def _fedavg_loss(referee: Referee, updates: Sequence[ClientUpdate]) -> float:
    return referee.loss(fedavg([u.delta for u in updates], [u.num_samples for u in updates]))


def _without_each(updates: Sequence[ClientUpdate], flats: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Per update, the FedAvg of the round's other updates, flattened: the weighted total less its
    own share, so the round costs one pass over the updates, not one per update."""
    weights = {u.participant: float(u.num_samples) for u in updates}
    total = sum(weights.values())
    summed = sum(weights[p] * flats[p] for p in weights)
    assert isinstance(summed, Tensor)
    return {p: (summed - weights[p] * flats[p]) / (total - weights[p]) for p in weights}


@dataclass(frozen=True)
class Direction:
    """Each update's cosine with the referee's descent and with the FedAvg of the round's others."""

    descent: dict[str, float]
    others: dict[str, float]


def directions(updates: Sequence[ClientUpdate], referee: Referee) -> Direction:
    descent = referee.descent()
    reference = flat_delta(descent)
    flats = {u.participant: flat_delta(u.delta) for u in updates}
    others = _without_each(updates, flats)
    return Direction(
        {u.participant: _descent_cosine(u, descent, reference) for u in updates},
        {p: _cosine(flats[p], others[p]) for p in flats},
    )


def clippable(
    bounded: BoundedUpdates,
    updates: Sequence[ClientUpdate],
    federation_counts: Sequence[int],
    referee: Referee | None,
) -> set[str]:
    """Of the updates clipped to the norm bound, those clip-or-reject keeps: a data-rich member's larger
    step. Its member declares more samples than the federation's median (more data, more local steps:
    the honest reason for a larger update that the coordinator can check; a declared count is capped
    by the weight cap, so a lie buys little) and it points along the referee's descent (cosine above
    MARGIN). Nothing without a referee or declared counts to tell them by."""
    if referee is None or not federation_counts:
        return set()
    median = statistics.median(federation_counts)
    richer = {u.participant for u in updates if u.participant in bounded.clipped and u.num_samples > median}
    if not richer:
        return set()
    descent = referee.descent()
    reference = flat_delta(descent)
    return {
        u.participant
        for u in bounded.updates
        if u.participant in richer and _descent_cosine(u, descent, reference) > MARGIN
    }


def direction_outliers(
    updates: Sequence[ClientUpdate], tolerance: float, referee: Referee
) -> tuple[dict[str, float], Direction | None]:
    """Participants whose update works against the referee and the round: its cosine with the descent
    lies below the federation's `tolerance` (GuardMemory.tolerance: how far its participants' accepted
    updates strayed), its cosine with the others' FedAvg below -MARGIN, and the round's FedAvg scores
    a lower loss without it. At least one update remains. Two updates go to `_arbitrate`.
    Returns them (with their cosines with the descent) and every update's cosines."""
    if len(updates) < 2:
        return {}, None
    found = directions(updates, referee)
    if len(updates) == 2:
        return _arbitrate(updates, found, referee), found
    low_descent, low_others = tolerance, -MARGIN
    suspects = [
        u
        for u in updates
        if found.descent[u.participant] < low_descent and found.others[u.participant] < low_others
    ]
    if not suspects:
        return {}, found
    everyone = _fedavg_loss(referee, updates)
    out = {
        s.participant: found.descent[s.participant]
        for s in suspects
        if _fedavg_loss(referee, [u for u in updates if u.participant != s.participant]) < everyone
    }
    if len(out) == len(updates):  # never all: the one pointing most along the descent stays
        del out[max(out, key=out.__getitem__)]
    return out, found


def _arbitrate(updates: Sequence[ClientUpdate], found: Direction, referee: Referee) -> dict[str, float]:
    """Two updates, no majority: when they point apart, the one against the referee's descent whose
    removal alone lowers the loss of the round's FedAvg (the other's raises it) is turned away."""
    first, second = updates
    if found.others[first.participant] >= -MARGIN:
        return {}
    everyone = _fedavg_loss(referee, updates)
    helps = {u.participant: referee.loss(v.delta) < everyone for u, v in ((first, second), (second, first))}
    if helps[first.participant] == helps[second.participant]:
        return {}
    worse = first.participant if helps[first.participant] else second.participant
    return {worse: found.descent[worse]} if found.descent[worse] < 0 else {}
