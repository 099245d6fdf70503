"""A toy model for the update guard's tests: a quadratic loss around a target, honest updates towards it."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from fedsv.fl.updates import ClientUpdate

DIM = 2000
"""Parameters of the toy model: in 200, the weakest honest signals below (cosine 0.2 with the descent)
would lie within the band of a random direction, and be taken for free riders (update_screen)."""


class Quadratic:
    """A referee whose loss is ||w_t + delta - target||^2: its descent points at the target."""

    def __init__(self, target: Tensor) -> None:
        self.target = target

    def descent(self) -> dict[str, Tensor]:
        return {"w": 2 * self.target}

    def loss(self, delta: Mapping[str, Tensor]) -> float:
        return float(((delta["w"] - self.target) ** 2).sum())

    def losses(self, delta: Mapping[str, Tensor]) -> Tensor:
        """Per coordinate, scaled so that their mean is `loss`."""
        return DIM * (delta["w"] - self.target) ** 2


def honest_update(
    rng: torch.Generator, target: Tensor, pid: str, signal: float, count: int = 100
) -> ClientUpdate:
    """A step towards the target (a share `signal` of it) plus noise of about the same norm."""
    noise = torch.randn(DIM, generator=rng, dtype=torch.float64)
    step = signal * target + 0.3 * noise * target.norm() / math.sqrt(DIM)
    return ClientUpdate(pid, {"w": step}, count)


def toy_round(seed: int, m: int, signal: float = 0.3) -> tuple[list[ClientUpdate], Quadratic]:
    rng = torch.Generator().manual_seed(seed)
    target = torch.randn(DIM, generator=rng, dtype=torch.float64)
    return [honest_update(rng, target, f"p{i:03d}", signal) for i in range(m)], Quadratic(target)
