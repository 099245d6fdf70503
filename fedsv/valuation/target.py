"""Sampling to an accuracy target: a budgeted sampler run with doubling budgets until its error is small.

Every attempt runs the same seeded sampler on the same memoized game, allowed twice the new
evaluations of the one before; coalitions already evaluated cost nothing again, and the draws of an
attempt begin with those of the last. It stops once every value's standard error is at most `target`,
when the evaluation cap (distinct evaluations over all attempts) has no room for another attempt, or
when all 2^m coalitions are known. The stopping rule reads only the game's utilities, never the clock,
so valuing the same round again gives the same values.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from fedsv.valuation.budget import minimum_budget
from fedsv.valuation.estimator import Estimator, Outcome, Settings
from fedsv.valuation.game import Game
from fedsv.valuation.result import ValuationResult

logger = logging.getLogger(__name__)

FIRST_BUDGET_PER_PLAYER = 16
"""The first attempt's budget: the border plus this many evaluations per player."""


def reached(stderr: np.ndarray | None, target: float) -> bool:
    """True when every standard error is known (finite) and at most `target`."""
    return stderr is not None and bool(np.all(np.isfinite(stderr)) and np.max(stderr, initial=0.0) <= target)


class ToTarget(Estimator):
    """`sampler` (a budgeted method) run to a standard error of at most `target` for every value, within
    `cap` distinct evaluations. The result's method is the sampler's; extra["target"] says whether the
    target was reached, with how many attempts and what budget."""

    def __init__(self, sampler: type[Estimator], settings: Settings, target: float, cap: int) -> None:
        if not sampler.sampling:
            raise ValueError(f"{sampler.method} does not sample: it has no budget to grow")
        if not (np.isfinite(target) and target > 0):
            raise ValueError(f"the target standard error must be a positive number, got {target}")
        self.sampler, self.settings, self.target, self.cap = sampler, settings, float(target), int(cap)

    def run(self, game: Game) -> ValuationResult:
        return dataclasses.replace(super().run(game), method=self.sampler.method)

    def estimate(self, game: Game) -> Outcome:
        m, start = game.m, game.evaluations
        cap = min(self.cap, 2**m)
        allowance = min(cap, max(minimum_budget(m) + FIRST_BUDGET_PER_PLAYER * m, 2))
        attempts, allowances = 0, []
        while True:
            attempts += 1
            allowances.append(allowance)
            # an attempt may evaluate `allowance` new coalitions; those of earlier attempts are free
            result = self.sampler.configured(allowance, self.settings).run(game)
            spent = game.evaluations - start
            left = cap - spent
            if reached(result.stderr, self.target) or left < minimum_budget(m) or spent >= 2**m:
                break
            allowance = min(2 * allowance, left)
        worst = float(np.max(result.stderr)) if result.stderr is not None else 0.0
        ok = reached(result.stderr, self.target)
        logger.debug("%s to stderr %g: %d attempts, %d evaluations, largest %g",
                     self.sampler.method, self.target, attempts, spent, worst)  # fmt: skip
        target = {
            "stderr": self.target,
            "reached": ok,
            "attempts": attempts,
            "evaluations": spent,
            "cap": self.cap,
            "allowances": allowances,  # each attempt's budget: what a replay needs (by_class)
        }
        extra = {**result.extra, "target": target}
        return Outcome(
            result.values,
            result.stderr,
            result.utility_empty,
            result.utility_grand,
            result.samples,
            extra,
        )
