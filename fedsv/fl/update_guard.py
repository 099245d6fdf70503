"""The round's screen of updates before aggregation: bounded weights, norms with memory, a direction check.

One dishonest participant must not steer the model, and honest rounds must stay plain FedAvg. Each
step leaves alone a round whose updates are alike and acts on an update that stands apart:

1. **Weights**: a FedAvg weight (declared sample count) is capped at `count_multiple` times the
   federation's median declared count: declaring 10^7 samples buys no more than that.
2. **Norms** (`update_bounds`): the bound's typical norm is the median over this round's norms and the
   accepted norms of the last `history_rounds` rounds (the smaller of two when there are fewer than
   three), so that in a round of two updates neither sets its own bound. Under "clip-or-reject" (the
   default) an update over the bound is clipped when it is a data-rich member's larger step
   (`update_direction.clippable`: more declared samples than the median, along the referee's descent)
   and dropped otherwise.
3. **Trusted step** (`trusted_step`): an update whose cosine with the step the validation set itself
   takes from w_t (trained as members train) lies below 0 beyond noise is turned away, unless every
   update of the round is: sign flips and inner-product manipulation, also as a round's majority.
4. **Direction** (`update_direction`): the coordinator's validation set referees (`referee.Referee`).
   With three updates or more, an update is turned away when its cosine with the validation loss's
   descent at w_t lies below what this federation's honest updates reach (`GuardMemory.tolerance`: far
   in a skewed non-IID federation, just below 0 in an IID one), it points away from the FedAvg of the
   round's others, and the round's FedAvg scores a lower validation loss without it. With two updates
   that point apart, the one whose removal alone lowers that loss is turned away. Sign flips, minus the
   others' mean and reversed updates under a large declared count are caught; the tests and
   docs/deployment.md give the attack matrix and the honest runs that stay FedAvg.
5. **Free riders and colluders** (`update_screen`, `public_steps`): an update that carries no information
   (norm 0, or a random direction) is turned away as null, and one that carries nothing beyond the
   global model's recent steps but noise (a mimic replaying the federation's own step) as a mimic's
   (with the direction check and screens off, such an update is aggregated but marked public:
   the round's game holds it in every coalition and pays it nothing), and one whose first layer moved
   outside the span of the validation data's inputs as made-up inputs move it (`input_span`); members
   that send the very same vector, as a colluding group does, are all turned away (`identical_updates`);
   when the round's FedAvg still raises the validation loss beyond its noise, updates pointing against
   the descent beyond the tolerance are dropped until it does not. Only updates that passed every check
   enter the memory.
6. **Reputation** (`reputation`): every update's effect on the validation loss of the round's aggregate
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

from fedsv.fl.identical_updates import identical_updates
from fedsv.fl.input_span import InputSpan, off_data
from fedsv.fl.public_steps import PublicSteps, mimicked
from fedsv.fl.referee import Referee
from fedsv.fl.reputation import Evidence, Reputation, ReputationChange, marginals
from fedsv.fl.trusted_step import TrustedStep, against_step
from fedsv.fl.update_bounds import BoundedUpdates, NormBound, bound_updates, keep_clipped, typical_norm
from fedsv.fl.update_direction import MARGIN, Direction, clippable, direction_outliers, directions
from fedsv.fl.update_screen import null_updates, worse_round
from fedsv.fl.updates import ClientUpdate


@dataclass(frozen=True)
class GuardSettings:
    """count_multiple: cap on a FedAvg weight, times the federation's median declared count (0: off).
    direction: turn away updates that work against the validation set and the round's other updates.
    history_rounds: past rounds whose accepted norms join the norm bound's median (0: this round's only,
        and a round of two takes their mean, as before the guard).
    quarantine: hold back (value, not aggregate) the updates of members whose updates keep making the
        validation loss worse (fedsv.fl.reputation).
    trusted_step: turn away updates that point against the validation set's own step from w_t
        (fedsv.fl.trusted_step).
    """

    count_multiple: float = 3.0
    direction: bool = True
    history_rounds: int = 3
    quarantine: bool = True
    trusted_step: bool = True

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.count_multiple) and (self.count_multiple == 0 or self.count_multiple >= 1)
        ):
            raise ValueError(f"update_count_multiple must be 0 (off) or >= 1, got {self.count_multiple}")
        if not 0 <= self.history_rounds <= 1000:
            raise ValueError(f"update_norm_history must be in 0..1000 rounds, got {self.history_rounds}")


SPREAD = 3.0
"""Median absolute deviations of the participants' lowest cosines with the validation descent that an
update may lie below their median: how far a skewed federation's honest updates are allowed to stray."""


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
    made_up: dict[str, float] = field(default_factory=dict)  # off the data's inputs: share outside their span
    held: dict[str, float] = field(default_factory=dict)  # quarantined: participant -> its update's effect
    evidence: dict[str, Evidence] = field(default_factory=dict)  # every update's effect (reputation)
    reputation: ReputationChange = field(default_factory=ReputationChange)  # who entered or left quarantine
    public: dict[str, float] = field(default_factory=dict)  # screens off: kept mimics, valued 0 (public)
    against: dict[str, float] = field(default_factory=dict)  # against the trusted step: its cosine with it
    identical: dict[str, str] = field(default_factory=dict)  # the same vector as another's: that other


def cap_counts(
    updates: Sequence[ClientUpdate], federation_counts: Sequence[int], multiple: float
) -> tuple[list[ClientUpdate], dict[str, int]]:
    """Each update's weight capped at `multiple` x the median of the federation's declared counts."""
    if multiple == 0 or not federation_counts:
        return list(updates), {}
    cap = max(1, int(multiple * statistics.median(federation_counts)))
    capped = {u.participant: u.num_samples for u in updates if u.num_samples > cap}
    return [replace(u, num_samples=cap) if u.participant in capped else u for u in updates], capped


def guard_updates(
    updates: Sequence[ClientUpdate],
    norm_rule: NormBound,
    settings: GuardSettings,
    memory: GuardMemory,
    federation_counts: Sequence[int],
    referee: Referee | None = None,
    global_params: Mapping[str, Tensor] | None = None,
    span: InputSpan | None = None,
    trusted: TrustedStep | None = None,
) -> GuardedRound:
    """Screen a round's updates (in their order): quarantined members' held back, weights capped, the norm
    bound with memory, the direction check and the screens; the memory learns from the kept updates only,
    and the reputation from every update's effect. `global_params`: w_t, whose step from the last round's
    the mimic screen learns (none: that screen learns nothing); `span`: the validation inputs' span as
    the model's first layer sees them (input_span; none: no made-up-input screen); `trusted`: the round's
    trusted step (trusted_step; none: no such screen)."""
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
    against: dict[str, float] = {}
    if settings.trusted_step and trusted is not None and len(bounded.updates) > 1:  # a lone one is kept
        # first: the rules below learn from the rest
        against = against_step(bounded.updates, trusted())
        bounded = replace(bounded, updates=[u for u in bounded.updates if u.participant not in against])
    turned_away: dict[str, float] = {}
    null: dict[str, float] = {}
    worse: dict[str, float] = {}
    mimic: dict[str, float] = {}
    made_up: dict[str, float] = {}
    identical: dict[str, str] = {}
    found: Direction | None = None
    if settings.direction and referee is not None:
        turned_away, found = direction_outliers(bounded.updates, memory.tolerance(), referee)
        rest = [u for u in bounded.updates if u.participant not in turned_away]
        if turned_away:  # what the kept updates' cosines are without them (learned from two or more)
            found = directions(rest, referee) if len(rest) >= 2 else None
        if found is not None:  # update_screen: free riders, then a round the referee finds worse
            typical = typical_norm([*bounded.norms.values(), *memory.past()], smaller_of_few=False)
            null = null_updates(rest, bounded.norms, typical, found.descent, found.others)
            rest = [u for u in rest if u.participant not in null]
            mimic = mimicked(rest, memory.public, referee.descent())
            rest = [u for u in rest if u.participant not in mimic]
            made_up = off_data(rest, span)
            rest = [u for u in rest if u.participant not in made_up]
            identical = identical_updates(rest)
            if rest and len(identical) == len(rest):  # never an empty round: the group weighs as one
                identical.pop(rest[0].participant)
            rest = [u for u in rest if u.participant not in identical]
            worse = worse_round(rest, referee, found.descent, memory.tolerance()) if rest else {}
            if null or worse or mimic or made_up or identical:
                rest = [u for u in rest if u.participant not in worse]
                found = directions(rest, referee) if len(rest) >= 2 else None
    public: dict[str, float] = {}
    if not settings.direction and referee is not None:  # the screens off: aggregated, but paid nothing
        public = mimicked(bounded.updates, memory.public, referee.descent())
    dropped = {**against, **turned_away, **null, **mimic, **made_up, **identical, **worse}
    kept = [
        replace(u, public=True) if u.participant in public else u
        for u in bounded.updates
        if u.participant not in dropped
    ]
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
        screened = {*null, *mimic, *made_up}  # nothing of theirs to value: turned away as such
        others = [u for u in [*weighted, *holding] if u.participant not in kept_ids | screened]
        evidence = marginals(referee, kept, others)
        change = memory.reputation.observe(evidence, sorted(kept_ids))
    held = {u.participant: evidence[u.participant].effect for u in holding}
    return GuardedRound(
        kept,
        bounded,
        capped,
        turned_away,
        null,
        worse,
        mimic,
        made_up,
        held,
        evidence,
        change,
        public,
        against,
        identical,
    )
