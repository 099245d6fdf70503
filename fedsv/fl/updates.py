"""What a participant hands the coordinator each round: its delta and its declared sample count."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ClientUpdate:
    """What one participant contributed to a round: its delta (trained - w_t) and its sample count;
    `public`: the guard found it carries nothing beyond the global model's recent steps and kept it, its
    screens being off (fedsv.fl.public_steps): aggregated, and valued as part of every coalition."""

    participant: str
    delta: Mapping[str, Tensor]
    num_samples: int
    public: bool = False


def flat_delta(delta: Mapping[str, Tensor]) -> Tensor:
    """A delta's floating tensors as one float64 vector (integer buffers left out)."""
    return torch.cat([t.reshape(-1).to(torch.float64) for t in delta.values() if t.is_floating_point()])
