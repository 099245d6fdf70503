"""Value history as reputation: a member whose updates keep making the validation loss worse is quarantined.

Each round the referee values every update that reached it (`marginals`): its effect on the validation
loss of the round's aggregate, the leave-one-out change for an update that was aggregated and the
add-one change for one that was not (turned away, or quarantined), with the validation set's paired
standard error. A member's score over its last WINDOW updates is their mean effect over its error,
which counts the validation set's noise and the federation's own round-to-round spread (a robust
spread of the aggregated updates' effects over the last SPREAD_ROUNDS rounds: in a skewed non-IID
federation honest updates also make the loss worse now and then, and by far more than the validation
set's noise alone).

The spread is measured on the members **not under suspicion**: the members whose last updates made
the loss worse on average (mean effect above 0), the worst first and never more than a minority of
the members seen, do not count in it. Colluders that are aggregated together widen the spread of
everyone's effects; they cannot widen this one (docs/decisions/0001-reputation-spread.md). Only
aggregated updates set it, so members turned away cannot widen it either.

Harm is measured from 0, or from the median effect of the members not under suspicion where that is
itself harmful: one member's larger helpful step makes every other member's leave-one-out effect
harmful, and they are not harmful for it. A score over ENTER (after at least MIN_UPDATES updates)
quarantines the member, the worst first, while fewer than half of the members seen are in quarantine:
its updates are still valued (its add-one effect, this module's evidence) but not aggregated. It is
readmitted once MIN_UPDATES updates sent in quarantine score LEAVE or less.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedsv.fl.referee import Referee
from fedsv.fl.state import fedavg
from fedsv.fl.updates import ClientUpdate

WINDOW = 3
"""A member's last updates its score is taken over."""
MIN_UPDATES = 2
"""Updates a member must have sent (in quarantine: since it was quarantined) before it is judged."""
ENTER = 4.0
"""The score (standard errors of harm) over which a member is quarantined."""
LEAVE = 1.0
"""The score at or under which a quarantined member is readmitted."""
SPREAD_ROUNDS = 3
"""Rounds whose aggregated updates' effects give the federation's spread."""
MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class Evidence:
    """An update's effect on the validation loss of its round's aggregate (positive: worse) and its
    standard error over the validation samples."""

    effect: float
    stderr: float


@dataclass(frozen=True)
class ReputationChange:
    """Who a round's evidence quarantined and readmitted, each with its score."""

    quarantined: dict[str, float] = field(default_factory=dict)
    readmitted: dict[str, float] = field(default_factory=dict)


def _losses(referee: Referee, updates: Sequence[ClientUpdate], like: Mapping[str, Tensor]) -> Tensor:
    if not updates:
        return referee.losses({name: torch.zeros_like(t) for name, t in like.items()})
    return referee.losses(fedavg([u.delta for u in updates], [u.num_samples for u in updates]))


LARGEST = 1e9
"""A per-sample loss change past this (an overflow, a diverged model: NaN) counts as this much harm."""


def _evidence(difference: Tensor) -> Evidence:
    difference = torch.nan_to_num(difference.to(torch.float64), nan=LARGEST, posinf=LARGEST, neginf=-LARGEST)
    difference = difference.clamp(-LARGEST, LARGEST)
    n = max(difference.numel(), 1)
    stderr = float(difference.std()) / math.sqrt(n) if n > 1 else 0.0
    return Evidence(float(difference.mean()), stderr)


def marginals(
    referee: Referee, aggregated: Sequence[ClientUpdate], others: Sequence[ClientUpdate]
) -> dict[str, Evidence]:
    """Each update's effect on the loss of the round's aggregate: leave-one-out for the `aggregated`,
    add-one for the `others` (turned away or quarantined). One pass over the validation set per update."""
    if not aggregated and not others:
        return {}
    like = (aggregated or others)[0].delta
    full = _losses(referee, aggregated, like)
    out: dict[str, Evidence] = {}
    for u in aggregated:
        rest = [v for v in aggregated if v is not u]
        out[u.participant] = _evidence(full - _losses(referee, rest, like))
    for u in others:
        out[u.participant] = _evidence(_losses(referee, [*aggregated, u], like) - full)
    return out


@dataclass
class Reputation:
    """Per member its last updates' evidence, the aggregated effects of recent rounds, and who is in
    quarantine (with the evidence of the updates it sent there)."""

    history: dict[str, deque[Evidence]] = field(default_factory=dict)
    spreads: deque[dict[str, float]] = field(default_factory=deque)
    quarantined: set[str] = field(default_factory=set)

    def minority(self) -> int:
        """The most members that may be suspects, or in quarantine, at once: fewer than half of those
        the reputation has seen (a dishonest minority is what it guards against)."""
        return max(0, (len(self.history) - 1) // 2)

    def suspects(self) -> set[str]:
        """Members whose last updates made the validation loss worse on average (mean effect above 0),
        the worst first, never more than a minority: where most members' updates make the loss worse
        (one member's larger helpful step makes every other one's leave-one-out effect harmful), the
        majority is not suspect."""
        means = {p: sum(e.effect for e in seen) / len(seen) for p, seen in self.history.items() if seen}
        harmful = sorted((p for p, m in means.items() if m > 0), key=lambda p: (-means[p], p))
        return set(harmful[: self.minority()])

    def _trusted_effects(self) -> list[float]:
        """The recent aggregated effects of the members not under suspicion."""
        suspects = self.suspects()
        return [e for round_effects in self.spreads for p, e in round_effects.items() if p not in suspects]

    def level(self) -> float:
        """Where harm is measured from: 0, or the median effect of the members not under suspicion
        where that is itself harmful (one member's larger helpful step makes every other member's
        leave-one-out effect harmful; they are not harmful for it)."""
        effects = self._trusted_effects()
        return max(0.0, statistics.median(effects)) if len(effects) >= 3 else 0.0

    def spread(self) -> float:
        """The federation's round-to-round spread of aggregated effects, over the members not under
        suspicion (0 until three such effects are known)."""
        effects = self._trusted_effects()
        if len(effects) < 3:
            return 0.0
        middle = statistics.median(effects)
        return MAD_TO_SD * statistics.median(abs(e - middle) for e in effects)

    def score(
        self, participant: str, spread: float | None = None, level: float | None = None
    ) -> float | None:
        """Mean effect of the member's last updates, less the level (level()), over its error; None with
        fewer than MIN_UPDATES. `spread`, `level`: the federation's, when the caller has them already."""
        seen = list(self.history.get(participant, ()))
        if len(seen) < MIN_UPDATES:
            return None
        n = len(seen)
        mean = sum(e.effect for e in seen) / n - (self.level() if level is None else level)
        federation = self.spread() if spread is None else spread
        variance = (sum(e.stderr**2 for e in seen) / n + federation**2) / n
        if variance <= 0:
            return math.inf if mean > 0 else 0.0
        return mean / math.sqrt(variance)

    def observe(self, evidence: Mapping[str, Evidence], aggregated: Sequence[str]) -> ReputationChange:
        """Take a round's evidence (`aggregated`: whose updates were aggregated); quarantine and readmit."""
        self.spreads.append({p: evidence[p].effect for p in aggregated if p in evidence})
        while len(self.spreads) > SPREAD_ROUNDS:
            self.spreads.popleft()
        for pid in sorted(evidence):
            self.history.setdefault(pid, deque(maxlen=WINDOW)).append(evidence[pid])
        change = ReputationChange()
        spread, level = self.spread(), self.level()
        entering: dict[str, float] = {}
        for pid in sorted(evidence):
            score = self.score(pid, spread, level)
            if score is None:
                continue
            if pid not in self.quarantined and score > ENTER:
                entering[pid] = score
            elif pid in self.quarantined and score <= LEAVE:
                self.quarantined.discard(pid)
                change.readmitted[pid] = score
        for pid in sorted(entering, key=lambda p: (-entering[p], p)):  # the worst first, a minority at most
            if len(self.quarantined) >= self.minority():
                break
            self.quarantined.add(pid)
            self.history[pid].clear()  # readmission is judged on the updates sent in quarantine
            change.quarantined[pid] = entering[pid]
        return change

    def to_json(self) -> dict[str, object]:
        return {
            "history": {p: [[e.effect, e.stderr] for e in h] for p, h in sorted(self.history.items())},
            "spreads": [dict(sorted(r.items())) for r in self.spreads],
            "quarantined": sorted(self.quarantined),
        }

    @classmethod
    def from_json(cls, data: object) -> Reputation:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ValueError("the checkpoint's reputation is malformed")
        history, spreads, quarantined = (
            data.get("history", {}),
            data.get("spreads", []),
            data.get("quarantined", []),
        )
        if (
            not isinstance(history, Mapping)
            or not isinstance(spreads, list)
            or not isinstance(quarantined, list)
        ):
            raise ValueError("the checkpoint's reputation is malformed")
        return cls(
            {str(p): deque((_read_evidence(e) for e in h), maxlen=WINDOW) for p, h in history.items()},
            deque(_read_spread(r) for r in spreads),
            {str(p) for p in quarantined},
        )


def _read_evidence(entry: object) -> Evidence:
    """[effect, stderr]."""
    if not isinstance(entry, list) or len(entry) != 2:
        raise ValueError("the checkpoint's reputation is malformed")
    return Evidence(float(entry[0]), float(entry[1]))


def _read_spread(effects: object) -> dict[str, float]:
    """A round's aggregated effects by member; a checkpoint before members were kept (a list) reads
    them as members of their own, never suspects."""
    if isinstance(effects, Mapping):
        return {str(p): float(e) for p, e in effects.items()}
    if isinstance(effects, list):
        return {f"#{i}": float(e) for i, e in enumerate(effects)}
    raise ValueError("the checkpoint's reputation is malformed")
