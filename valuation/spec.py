"""ValuationSpec: which estimator values a game, to what accuracy, with which seed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedsv.valuation.exact import HARD_MAX_PLAYERS
from fedsv.valuation.permutation import check_accuracy

METHODS = ("auto", "exact", "permutation", "group_testing", "loo", "random")
SHAPLEY_METHODS = ("exact", "permutation", "group_testing")


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")


@dataclass(frozen=True)
class ValuationSpec:
    """How to value a game; checked on construction.

    method: "exact", "permutation", "group_testing", "loo", "random" or "auto" (the cheapest planned
        Shapley method, see plan()).
    eps, delta: the sampling methods aim at P(max_i |s_i_hat - s_i| <= eps) >= 1 - delta, valid when
        max U - min U <= utility_range.
    seed: seeds the sampling methods and "random".
    max_exact_players: the largest game "exact" enumerates (and "auto" considers exact for).
    """

    method: str = "auto"
    eps: float = 0.05
    delta: float = 0.05
    seed: int = 0
    utility_range: float = 1.0
    max_exact_players: int = 20

    def __post_init__(self) -> None:
        check_method(self.method)
        check_accuracy(self.eps, self.delta, self.utility_range)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        players = self.max_exact_players
        if isinstance(players, bool) or not isinstance(players, int) or not 1 <= players <= HARD_MAX_PLAYERS:
            raise ValueError(f"max_exact_players must be an integer in 1..{HARD_MAX_PLAYERS}, got {players}")

    def with_seed(self, seed: int) -> ValuationSpec:
        """The same spec with another seed (e.g. one per round)."""
        return dataclasses.replace(self, seed=seed)
