"""What a participant hands the coordinator each round: its delta and its declared sample count."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class ClientUpdate:
    """What one participant contributed to a round: its delta (trained - w_t) and its sample count."""

    participant: str
    delta: Mapping[str, Tensor]
    num_samples: int
