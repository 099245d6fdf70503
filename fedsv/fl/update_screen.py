"""The guard's two last screens: updates that carry no information, and a round the referee finds worse.

1. **Null updates** (free riders). An update of norm 0 (the global model sent back untrained), or one
   of less than NULL_NORM of the round's typical norm whose direction is no more related to the
   validation loss's descent and to the round's other updates than a random direction is
   (d (c_descent^2 + c_others^2) below NULL_QUANTILE, d the number of parameters: a little Gaussian
   noise), carries nothing learned from data. FedAvg would still
   give it a weight, and that weight shrinks every step it joins: under the paper's game such a member
   earns value for nothing (docs/deployment.md). It is turned away, so it is not aggregated and is
   valued 0 in the round. Updates from real training lie far outside that band, whichever way they
   point (a skewed non-IID update may point away from the descent, but not at random).
2. **A round the referee finds worse.** When the FedAvg of the round's remaining updates raises the
   validation loss over w_t's by more than WORSE_SIGMAS standard errors of the per-sample difference,
   the updates that agree with another update of the round (cosine AGREEMENT or more) and either point
   against the descent beyond the federation's tolerance or make the round's aggregate worse by
   themselves (their leave-one-out effect on the loss over WORSE_SIGMAS standard errors) are dropped
   one at a time, the one whose removal lowers the loss most first, until the round is no longer worse
   beyond its noise. This catches colluders that send the same direction: each one's "others" is
   dominated by its partner, so the direction check passes them, but their round fails the referee.
   "A little is enough" colluders send one vector along the descent (their mean plus a multiple of
   their spread): the leave-one-out half catches them. At least one update remains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedsv.fl.referee import Referee
from fedsv.fl.state import fedavg
from fedsv.fl.updates import ClientUpdate, flat_delta

NULL_NORM = 0.1
"""An update is taken for a free rider's only if its norm is also below this share of the round's typical
norm: late in an IID run, honest updates are mostly SGD noise, nearly orthogonal to everything, but of
the honest size (a rider sending noise of the honest norm is a noise attacker, left to the other checks
and to its value)."""

AGREEMENT = 0.5
"""Colluders agree: an update is dropped from a round found worse only if another update of the round
has at least this cosine with it. Honest updates of a skewed (non-IID) federation may point against the
descent and make a round worse (client drift) early, before the federation's tolerance is learned, but
not in pairs."""

NULL_QUANTILE = 13.8
"""A random direction's cosine with a fixed one is about normal with variance 1 / d, so d (c_descent^2 +
c_others^2) is chi-square with 2 degrees of freedom for noise; below its 99.9% point (13.8) an update is
indistinguishable from noise (a noise update escapes 1 time in 1,000; in a model of 100,000 parameters
an update from real training would need both cosines within about 0.012 of 0 to be taken for noise)."""

WORSE_SIGMAS = 3.0
"""A round is worse when its aggregate raises the validation loss by more than this many standard errors
of the per-sample difference (the validation set's own noise)."""


def null_updates(
    updates: Sequence[ClientUpdate],
    norms: Mapping[str, float],
    typical: float,
    descent: Mapping[str, float],
    others: Mapping[str, float],
) -> dict[str, float]:
    """Participants whose update carries no information (norm 0, or below NULL_NORM x the `typical`
    norm with cosines with the descent and with the round's others both within the band of a random
    direction), with their cosine with the descent. Never every update: a round of only null updates is
    left to move nothing."""
    out: dict[str, float] = {}
    for u in updates:
        pid = u.participant
        spread = flat_delta(u.delta).numel() * (descent[pid] ** 2 + others.get(pid, 0.0) ** 2)
        if norms[pid] == 0 or (norms[pid] < NULL_NORM * typical and spread < NULL_QUANTILE):
            out[pid] = descent[pid]
    return {} if len(out) == len(updates) else out


def _losses_of(referee: Referee, updates: Sequence[ClientUpdate]) -> Tensor:
    """The per-sample validation losses of w_t plus the FedAvg of `updates` (not empty)."""
    return referee.losses(fedavg([u.delta for u in updates], [u.num_samples for u in updates]))


def _sigmas(difference: Tensor) -> float:
    """A per-sample loss difference's mean in standard errors (+-inf where it has no spread)."""
    difference = difference.to(torch.float64)
    error = float(difference.std()) / math.sqrt(max(difference.numel(), 1))
    mean = float(difference.mean())
    if error == 0:
        return math.inf if mean > 0 else -math.inf
    return mean / error


def worse_by(referee: Referee, base: Tensor, updates: Sequence[ClientUpdate]) -> float:
    """How many standard errors the FedAvg of `updates` raises the validation loss over w_t's
    (`base`: w_t's per-sample losses); -inf with no update."""
    if not updates:
        return -math.inf
    return _sigmas(_losses_of(referee, updates) - base)


def worse_round(
    updates: Sequence[ClientUpdate],
    referee: Referee,
    descent: Mapping[str, float],
    tolerance: float,
) -> dict[str, float]:
    """Participants dropped because the round's FedAvg is worse than w_t beyond the validation set's
    noise, their updates agree with another update of the round (AGREEMENT) and point against the
    descent below `tolerance` (the federation's, as the direction check uses it) or make the round's
    aggregate worse by themselves beyond WORSE_SIGMAS (leave-one-out): removed greedily
    while the round stays worse, never the last. With their cosines with the descent."""
    if not updates:
        return {}
    base = referee.losses({name: torch.zeros_like(t) for name, t in updates[0].delta.items()})
    kept = list(updates)
    if worse_by(referee, base, kept) <= WORSE_SIGMAS:
        return {}
    partnered = _partnered(updates)
    out: dict[str, float] = {}
    while len(kept) > 1:
        full = _losses_of(referee, kept)
        without = {  # the round's losses without each agreeing update: its leave-one-out effect and score
            u.participant: _losses_of(referee, [v for v in kept if v is not u])
            for u in kept
            if u.participant in partnered
        }
        suspects = [  # against the descent, or harmful by itself beyond the noise
            p for p in without if descent[p] < tolerance or _sigmas(full - without[p]) > WORSE_SIGMAS
        ]
        if not suspects:
            break
        scores = {p: _sigmas(without[p] - base) for p in suspects}
        drop = min(scores, key=lambda p: (scores[p], p))  # colluders sending one vector tie: by id
        out[drop] = descent[drop]
        kept = [u for u in kept if u.participant != drop]
        if scores[drop] <= WORSE_SIGMAS:
            break
    return out


def _partnered(updates: Sequence[ClientUpdate]) -> set[str]:
    """Participants whose update has a cosine of AGREEMENT or more with another update of the round."""
    flats = [flat_delta(u.delta) for u in updates]
    unit = [f / f.norm() if float(f.norm()) > 0 else f for f in flats]
    out: set[str] = set()
    for i, a in enumerate(unit):
        for j in range(i + 1, len(unit)):
            if float(a @ unit[j]) >= AGREEMENT:
                out.update((updates[i].participant, updates[j].participant))
    return out
