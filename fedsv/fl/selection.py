"""The run's seeded draws: who is selected in a round, and the seed of each selected rank's training."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def train_seed(seed: int, round_number: int, rank: int) -> int:
    """The seed of a rank's local training in a round (the coordinator sends it with the task)."""
    return seed * 1_000_003 + round_number * 1009 + rank


def select_ranks(
    rng: np.random.Generator, participants: int, per_round: int, fixed: Sequence[int] | None = None
) -> list[int]:
    """The round's selected ranks: a seeded draw of `per_round` of `participants`, sorted.

    The draw is made even when a `fixed` selection replaces it, so a run that replays some rounds'
    selections keeps the same random stream as the run it replays.
    """
    drawn = sorted(int(r) for r in rng.choice(participants, size=per_round, replace=False))
    return sorted(fixed) if fixed is not None else drawn
