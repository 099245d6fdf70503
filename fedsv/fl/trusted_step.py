"""The guard's trusted step: the validation set trained from w_t as a member trains (FLTrust's server
update, Cao et al., NDSS 2021), and the updates that point against it (`against_step`).

An honest member's update, even from two classes of ten or from thirty images of one, shares the
direction in which the coordinator's own data move the model: on the embedded MNIST its cosine with
that step is -0.015 at the lowest in IID and 0.02 with two classes each. A sign-flipped update or
inner-product manipulation (minus a multiple of the honest mean) points against it (-0.09 at the
highest), also where colluders are the majority of a round, where no rule over the round's updates
alone can tell them apart. The step costs the coordinator one local training per round on its
validation set (none in a round of one update, which it never turns away) and no message: the updates
it judges are those it received.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from torch import Tensor

from fedsv.fl.update_direction import MARGIN
from fedsv.fl.updates import ClientUpdate, flat_delta

TrustedStep = Callable[[], Mapping[str, Tensor]]
"""Trains the validation set from w_t as the run's members train and returns the delta of the model's
trainable parameters (fedsv.task.validation_step builds one per round)."""

RANDOM_SIGMAS = 5.0
"""How many standard deviations of a random direction's cosine (1/sqrt(d) in d dimensions) a cosine must
lie below 0 to count against an update, where that is further than MARGIN. Honest updates are not
isotropic: late in a tabular run (a 30-16-2 network, d = 530) two of seventy lay at -0.14, beyond 3
deviations (-0.13); the updates of a member whose labels are all wrong lay at -0.42 to -0.62. In
the digits' MLP (d near 100,000) MARGIN is the further of the two."""


def threshold(dimensions: int) -> float:
    """The cosine with the trusted step below which an update points against it (negative)."""
    return -max(MARGIN, RANDOM_SIGMAS / math.sqrt(max(dimensions, 1)))


def step_cosines(updates: Sequence[ClientUpdate], step: Mapping[str, Tensor]) -> dict[str, float]:
    """Each update's cosine with the trusted step, over the step's tensors (0 for a zero update)."""
    reference = flat_delta(step).cpu()
    norm = float(reference.norm())
    out: dict[str, float] = {}
    for u in updates:
        flat = flat_delta({name: u.delta[name] for name in step}).cpu()
        scale = norm * float(flat.norm())
        out[u.participant] = float(flat @ reference) / scale if scale > 0 else 0.0
    return out


def against_step(updates: Sequence[ClientUpdate], step: Mapping[str, Tensor]) -> dict[str, float]:
    """The updates whose cosine with the trusted step lies below `threshold`, with their cosines; none
    where every update of the round does (the validation set then disagrees with the whole round, which
    says more of the validation set than of any member) or the step is zero."""
    if not updates or not step:
        return {}
    cosines = step_cosines(updates, step)
    dimensions = sum(t.numel() for t in step.values())
    below = threshold(dimensions)
    found = {p: c for p, c in cosines.items() if c < below}
    if len(found) == len(updates):
        return {}
    return found
