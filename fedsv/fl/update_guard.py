"""The round's screen of updates before aggregation: bounded weights, norms with memory, a direction check.

One dishonest participant must not steer the model, and honest rounds must stay plain FedAvg. Each
step leaves alone a round whose updates are alike and acts on an update that stands apart:

1. **Weights**: a FedAvg weight (declared sample count) is capped at `count_multiple` times the
   federation's median declared count: declaring 10^7 samples buys no more than that.
2. **Norms** (`update_bounds`): the bound's typical norm is the median over this round's norms and the
   accepted norms of the last `history_rounds` rounds (the smaller of two when there are fewer than
   three), so that in a round of two updates neither sets its own bound. Under "clip-or-reject" (the
   default) an update over the bound is clipped when it is a data-rich member's larger step (`clippable`:
   more declared samples than the median, along the referee's descent) and dropped otherwise.
3. **Direction**: the coordinator's validation set referees (`referee.Referee`). With three updates
   or more, an update is turned away when its cosine with the validation loss's descent at w_t lies
   below what this federation's honest updates reach (`GuardMemory.tolerance`: far in a skewed
   non-IID federation, just below 0 in an IID one), it points away from the FedAvg of the round's
   others, and the round's FedAvg scores a lower validation loss without it. With two updates that
   point apart, the one whose removal alone lowers that loss is turned away. Sign flips, minus the
   others' mean and reversed updates under a large declared count are caught; the tests and
   docs/deployment.md give the attack matrix and the honest runs that stay FedAvg.
4. **Free riders and colluders** (`update_screen`, `public_steps`): an update that carries no information
   (norm 0, or a random direction) is turned away as null, and one that carries nothing beyond the
   global model's recent steps but noise (a mimic replaying the federation's own step) as a mimic's;
   when the round's FedAvg still raises the validation loss beyond its noise, updates pointing against
   the descent beyond the tolerance are dropped until it does not. Only updates that passed every check
   enter the memory.
5. **Reputation** (`reputation`): every update's effect on the validation loss of the round's aggregate
   is recorded; a member whose updates keep making it worse, beyond the validation set's noise and the
   federation's own spread, is quarantined (valued, not aggregated) until its updates stop doing so.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from torch import Tensor

from fedsv.fl.public_steps import PublicSteps, mimicked
from fedsv.fl.referee import Referee
from fedsv.fl.reputation import Evidence, Reputation, ReputationChange, marginals
from fedsv.fl.state import fedavg
from fedsv.fl.update_bounds import BoundedUpdates, NormBound, bound_updates, keep_clipped, typical_norm
from fedsv.fl.update_screen import null_updates, worse_round
from fedsv.fl.updates import ClientUpdate, flat_delta


@dataclass(frozen=True)
class GuardSettings:
    """count_multiple: cap on a FedAvg weight, times the federation's median declared count (0: off).
    direction: turn away updates that work against the validation set and the round's other updates.
    history_rounds: past rounds whose accepted norms join the norm bound's median (0: this round's only,
        and a round of two takes their mean, as before the guard).
    quarantine: hold back (value, not aggregate) the updates of members whose updates keep making the
        validation loss worse (fedsv.fl.reputation).
    """

    count_multiple: float = 3.0
    direction: bool = True
    history_rounds: int = 3
    quarantine: bool = True

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.count_multiple) and (self.count_multiple == 0 or self.count_multiple >= 1)
        ):
            raise ValueError(f"update_count_multiple must be 0 (off) or >= 1, got {self.count_multiple}")
        if not 0 <= self.history_rounds <= 1000:
            raise ValueError(f"update_norm_history must be in 0..1000 rounds, got {self.history_rounds}")


MARGIN = 0.05
"""How far below 0 a cosine must lie to count against an update (and, for clip-or-reject's clipped
updates, how far above 0 to count for one: a random direction in a model's space has a cosine near 0)."""
SPREAD = 3.0
"""Median absolute deviations of the participants' lowest cosines with the validation descent that an
update may lie below their median: how far a skewed federation's honest updates are allowed to stray."""
"""How far below the lowest cosines of the updates accepted so far (and below 0) a suspect's must lie."""


@dataclass
class GuardMemory:
    """What the guard remembers across rounds (and a checkpoint keeps): the norms of the updates it
    accepted in the last rounds, and per participant the lowest cosines its accepted updates had with
    the validation descent and with the round's other updates; and, in memory only, the global model's
    recent steps (public_steps)."""

    norms: deque[list[float]] = field(default_factory=deque)
    lowest: dict[str, tuple[float, float]] = field(default_factory=dict)
    reputation: Reputation = field(default_factory=Reputation)
    public: PublicSteps = field(default_factory=PublicSteps, compare=False, repr=False)

    def remember(self, accepted: Sequence[float], keep: int) -> None:
        self.norms.append(list(accepted))
        while len(self.norms) > keep:
            self.norms.popleft()

    def past(self) -> list[float]:
        return [n for round_norms in self.norms for n in round_norms]

    def learn(self, participant: str, descent: float, others: float) -> None:
        low = self.lowest.get(participant, (descent, others))
        self.lowest[participant] = (min(low[0], descent), min(low[1], others))

    def tolerance(self) -> float:
        """The lowest cosine with the validation descent this federation's updates are expected to reach:
        the median over participants of their lowest cosines less SPREAD x the median absolute deviation
        of those lows, and at most -MARGIN (-MARGIN until three participants are known). Skewed (non-IID)
        federations, whose honest updates stray far from the validation gradient, tolerate more; medians
        over participants: one participant, however it behaves, cannot move them far."""
        if len(self.lowest) < 3:
            return -MARGIN
        lows = [d for d, _ in self.lowest.values()]
        middle = statistics.median(lows)
        spread = statistics.median(abs(d - middle) for d in lows)
        return min(-MARGIN, middle - SPREAD * spread)

    def to_json(self) -> dict[str, object]:
        return {
            "norms": list(self.norms),
            "lowest": {p: list(v) for p, v in sorted(self.lowest.items())},
            "reputation": self.reputation.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> GuardMemory:
        norms, lowest = data.get("norms", []), data.get("lowest", {})
        if not isinstance(norms, list) or not isinstance(lowest, dict):
            raise ValueError("the checkpoint's guard memory is malformed")
        return cls(
            deque([float(n) for n in r] for r in norms),
            {str(p): (float(v[0]), float(v[1])) for p, v in lowest.items()},
            Reputation.from_json(data.get("reputation")),
        )


@dataclass(frozen=True)
class GuardedRound:
    """The updates to aggregate and value, and what the guard did to the others."""

    updates: list[ClientUpdate]
    bounded: BoundedUpdates
    capped: dict[str, int]  # participant -> its declared count, where the weight was capped
    turned_away: dict[str, float]  # participant -> its cosine with the descent, rejected for direction
    null: dict[str, float] = field(default_factory=dict)  # the same, turned away as null (free riders)
    worse: dict[str, float] = field(default_factory=dict)  # the same, dropped from a round found worse
    mimic: dict[str, float] = field(default_factory=dict)  # nothing beyond the recent steps: share along them
    held: dict[str, float] = field(default_factory=dict)  # quarantined: participant -> its update's effect
    evidence: dict[str, Evidence] = field(default_factory=dict)  # every update's effect (reputation)
    reputation: ReputationChange = field(default_factory=ReputationChange)  # who entered or left quarantine


def _cosine(a: Tensor, b: Tensor) -> float:
    norm = float(a.norm() * b.norm())
    return float(a @ b) / norm if norm > 0 else 0.0


def _descent_cosine(update: ClientUpdate, descent: Mapping[str, Tensor], reference: Tensor) -> float:
    """An update's cosine with the referee's descent (`reference`: the descent flattened), over the
    descent's parameters."""
    return _cosine(flat_delta({n: update.delta[n] for n in descent}), reference)


def cap_counts(
    updates: Sequence[ClientUpdate], federation_counts: Sequence[int], multiple: float
) -> tuple[list[ClientUpdate], dict[str, int]]:
    """Each update's weight capped at `multiple` x the median of the federation's declared counts."""
    if multiple == 0 or not federation_counts:
        return list(updates), {}
    cap = max(1, int(multiple * statistics.median(federation_counts)))
    capped = {u.participant: u.num_samples for u in updates if u.num_samples > cap}
    return [replace(u, num_samples=cap) if u.participant in capped else u for u in updates], capped


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
    updates: Sequence[ClientUpdate], memory: GuardMemory, referee: Referee
) -> tuple[dict[str, float], Direction | None]:
    """Participants whose update works against the referee and the round: its cosine with the descent
    lies below the federation's tolerance (GuardMemory.tolerance: how far its participants' accepted
    updates strayed), its cosine with the others' FedAvg below -MARGIN, and the round's FedAvg scores
    a lower loss without it. At least one update remains. Two updates go to `_arbitrate`.
    Returns them (with their cosines with the descent) and every update's cosines."""
    if len(updates) < 2:
        return {}, None
    found = directions(updates, referee)
    if len(updates) == 2:
        return _arbitrate(updates, found, referee), found
    low_descent, low_others = memory.tolerance(), -MARGIN
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


def guard_updates(
    updates: Sequence[ClientUpdate],
    norm_rule: NormBound,
    settings: GuardSettings,
    memory: GuardMemory,
    federation_counts: Sequence[int],
    referee: Referee | None = None,
    global_params: Mapping[str, Tensor] | None = None,
) -> GuardedRound:
    """Screen a round's updates (in their order): quarantined members' held back, weights capped, the norm
    bound with memory, the direction check and the screens; the memory learns from the kept updates only,
    and the reputation from every update's effect. `global_params`: w_t, whose step from the last round's
    the mimic screen learns (none: that screen learns nothing)."""
    if global_params is not None:
        memory.public.observe(global_params)
    weighted, capped = cap_counts(updates, federation_counts, settings.count_multiple)
    quarantine = memory.reputation.quarantined if settings.quarantine and referee is not None else set()
    holding = [u for u in weighted if u.participant in quarantine]
    if len(holding) == len(weighted):  # quarantine never empties a round: screened as usual
        holding = []
    held_ids = {u.participant for u in holding}
    weighted = [u for u in weighted if u.participant not in held_ids]
    guarded_norms = settings.history_rounds > 0  # the norms' memory on: the guard's small-round rule too
    bounded = bound_updates(weighted, norm_rule, memory.past(), smaller_of_few=guarded_norms)
    if norm_rule.policy == "clip-or-reject" and bounded.clipped:
        bounded = keep_clipped(bounded, clippable(bounded, weighted, federation_counts, referee))
    turned_away: dict[str, float] = {}
    null: dict[str, float] = {}
    worse: dict[str, float] = {}
    mimic: dict[str, float] = {}
    found: Direction | None = None
    if settings.direction and referee is not None:
        turned_away, found = direction_outliers(bounded.updates, memory, referee)
        rest = [u for u in bounded.updates if u.participant not in turned_away]
        if turned_away:  # what the kept updates' cosines are without them (learned from two or more)
            found = directions(rest, referee) if len(rest) >= 2 else None
        if found is not None:  # update_screen: free riders, then a round the referee finds worse
            typical = typical_norm([*bounded.norms.values(), *memory.past()], smaller_of_few=False)
            null = null_updates(rest, bounded.norms, typical, found.descent, found.others)
            rest = [u for u in rest if u.participant not in null]
            mimic = mimicked(rest, memory.public, referee.descent())
            rest = [u for u in rest if u.participant not in mimic]
            worse = worse_round(rest, referee, found.descent, memory.tolerance())
            if null or worse or mimic:
                rest = [u for u in rest if u.participant not in worse]
                found = directions(rest, referee) if len(rest) >= 2 else None
    dropped = {**turned_away, **null, **mimic, **worse}
    kept = [u for u in bounded.updates if u.participant not in dropped]
    memory.remember(
        [bounded.norms[u.participant] for u in kept if u.participant not in bounded.clipped],
        settings.history_rounds,
    )
    if found is not None:
        for u in kept:
            memory.learn(u.participant, found.descent[u.participant], found.others[u.participant])
    evidence: dict[str, Evidence] = {}
    change = ReputationChange()
    if settings.quarantine and referee is not None:
        kept_ids = {u.participant for u in kept}
        others = [
            u
            for u in [*weighted, *holding]
            if u.participant not in kept_ids and u.participant not in null and u.participant not in mimic
        ]
        evidence = marginals(referee, kept, others)
        change = memory.reputation.observe(evidence, sorted(kept_ids))
    held = {u.participant: evidence[u.participant].effect for u in holding}
    return GuardedRound(kept, bounded, capped, turned_away, null, worse, mimic, held, evidence, change)
