"""Baselines: leave-one-out values and seeded random values."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.game import Game
from fedsv.valuation.result import ValuationResult


class LeaveOneOut:
    """loo_i = U(all) - U(all without i): m + 1 coalitions, plus U(empty) for the record."""

    method = "loo"

    def run(self, game: Game) -> ValuationResult:
        m = game.m
        before = game.evaluations
        rows = np.ones((m + 2, m), dtype=bool)
        rows[0] = False  # empty set
        rows[2:] = ~np.eye(m, dtype=bool)  # all players but i
        utilities = game.utilities(rows)
        empty, grand = float(utilities[0]), float(utilities[1])
        return ValuationResult(
            values=grand - utilities[2:],
            evaluations=game.evaluations - before,
            method=self.method,
            stderr=None,
            utility_empty=empty,
            utility_grand=grand,
        )


class RandomValues:
    """The random baseline: standard-normal values from a seeded generator; evaluates nothing."""

    method = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def run(self, game: Game) -> ValuationResult:
        values = np.random.default_rng(self.seed).standard_normal(game.m)
        return ValuationResult(values=values, evaluations=0, method=self.method, stderr=None)
