"""Baselines: leave-one-out values and seeded random values."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.estimators.estimator import Estimator, Outcome, Settings
from fedsv.valuation.games.game import Game


class LeaveOneOut(Estimator):
    """loo_i = U(all) - U(all without i): m + 1 coalitions, plus U(empty) for the record."""

    method = "loo"
    shapley = False

    @classmethod
    def planned_evaluations(cls, m: int, budget: int, settings: Settings) -> int:
        return min(2**m, m + 2)

    def estimate(self, game: Game) -> Outcome:
        m = game.m
        rows = np.ones((m + 2, m), dtype=bool)
        rows[0] = False  # empty set
        rows[2:] = ~np.eye(m, dtype=bool)  # all players but i
        utilities = game.utilities(rows)
        empty, grand = float(utilities[0]), float(utilities[1])
        return Outcome(grand - utilities[2:], None, empty, grand)


class RandomValues(Estimator):
    """The random baseline: standard-normal values from a seeded generator; evaluates nothing."""

    method = "random"
    shapley = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @classmethod
    def configured(cls, evaluations: int, settings: Settings) -> Estimator:
        return cls(settings.seed)

    @classmethod
    def planned_evaluations(cls, m: int, budget: int, settings: Settings) -> int:
        return 0

    def estimate(self, game: Game) -> Outcome:
        return Outcome(np.random.default_rng(self.seed).standard_normal(game.m), None)
