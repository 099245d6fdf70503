"""Colluding attacks: a group that sees its members' honest updates and sends one crafted vector.

Both attacks are ByzFL's (EPFL, `byzfl.attacks`), with its default factors, computed here over the
colluders' own honest updates of the round (the group trains every member's data from w_t, whether the
round selected it or not, and every selected colluder sends the same vector):

- "a little is enough" (ALIE; Baruch, Baruch and Goldberg, NeurIPS 2019): the coordinate-wise mean of
  the group's honest updates plus `factor` times their coordinate-wise standard deviation (ByzFL: tau
  1.5);
- inner-product manipulation (IPM; Xie, Koyejo and Gupta, UAI 2019): minus `factor` times their mean
  (ByzFL: tau 2.0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

ATTACKS = ("alie", "ipm")
"""The colluding attacks, as the corruption spec names them."""
FACTORS = {"alie": 1.5, "ipm": 2.0}
"""Each attack's factor where the spec names none (ByzFL's defaults)."""


def colluded_update(kind: str, factor: float, honest: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The vector every selected colluder sends, from the group's honest updates (floating tensors;
    others are taken from the first update as they are). The standard deviation is the sample one (n -
    1), 0 for a group of one."""
    if kind not in ATTACKS:
        raise ValueError(f"unknown colluding attack {kind!r}; use one of {ATTACKS}")
    if not honest:
        raise ValueError("a colluding attack needs at least one honest update of the group")
    out: dict[str, Tensor] = {}
    for name, first in honest[0].items():
        if not first.is_floating_point():
            out[name] = first
            continue
        stacked = torch.stack([u[name].to(torch.float64) for u in honest])
        mean = stacked.mean(0)
        if kind == "ipm":
            crafted = -factor * mean
        else:
            spread = stacked.std(0, unbiased=True) if len(honest) > 1 else torch.zeros_like(mean)
            crafted = mean + factor * spread
        out[name] = crafted.to(first.dtype)
    return out
