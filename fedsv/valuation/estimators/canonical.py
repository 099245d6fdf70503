"""The canonical Shapley value: every coalition's utility from retraining it, averaged over seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.estimators.exact import all_coalitions, shapley_from_table
from fedsv.valuation.games.game import FloatArray

MAX_MEMBERS = 12
"""The most members whose 2^N coalitions a retraining benchmark may enumerate (4,096 retrainings a seed)."""

Retrain = Callable[[frozenset[int], int], float]
"""The utility of a coalition (member indices) retrained with one training seed: the score of the model
it trains on the validation set; the empty coalition's is the initial model's."""


@dataclass(frozen=True)
class CanonicalValues:
    """The canonical Shapley value of N members: `values[i]` from the seed-averaged utilities of all
    2^N coalitions, `errors[i]` its standard error over the seeds (the seeds' values' SD / sqrt(seeds);
    0 with one seed), and `utilities` the mean utility of each coalition by bitmask (bit i = member i)."""

    members: list[str]
    values: FloatArray
    errors: FloatArray
    utilities: FloatArray
    seeds: int

    def shares(self) -> FloatArray:
        """What each member is paid of a pot: its value over the sum, negative values paid nothing."""
        paid = np.maximum(self.values, 0.0)
        total = paid.sum()
        return paid / total if total > 0 else np.full(len(paid), 1.0 / len(paid))


def canonical_values(members: Sequence[str], retrain: Retrain, seeds: Sequence[int]) -> CanonicalValues:
    """Retrain every coalition of `members` with every seed, and value them exactly: the Shapley value
    whose utility is each coalition's mean retrained score. Each seed shares its initial model and its
    members' training seeds across coalitions (common random numbers), so a member's marginals differ by
    its data, not by the draw."""
    n = len(members)
    if not 1 <= n <= MAX_MEMBERS:
        raise ValueError(f"the canonical value retrains 2^N coalitions of 1..{MAX_MEMBERS} members, got {n}")
    if not seeds:
        raise ValueError("the canonical value needs at least one training seed")
    coalitions = all_coalitions(n)
    table = np.array(
        [[retrain(frozenset(np.flatnonzero(row).tolist()), seed) for row in coalitions] for seed in seeds],
        dtype=np.float64,
    )
    per_seed = np.array([shapley_from_table(coalitions, row) for row in table])
    spread = per_seed.std(axis=0, ddof=1) / np.sqrt(len(seeds)) if len(seeds) > 1 else np.zeros(n)
    return CanonicalValues(
        list(members),
        shapley_from_table(coalitions, table.mean(axis=0)),
        spread,
        table.mean(axis=0),
        len(seeds),
    )
