"""Sampling to an accuracy target: a budgeted sampler run with growing budgets until its error is small.

Every attempt runs the same seeded sampler on the same memoized game, allowed enough new
evaluations to bring the distinct ones to GROWTH times those before; coalitions already evaluated
cost nothing again, and the draws of an attempt begin with those of the last. It stops once every
value's standard error is at most its threshold, when the evaluation cap (distinct evaluations over
all attempts) has no room for another attempt, or when all 2^m coalitions are known.

The threshold is `target` for every value, or, with `noise_fraction`, that fraction of each value's own
validation noise (noise_target.py), measured after every attempt on the validation folds; `target`
then serves only a game that has no folds. With `exact_after`, a sampler that has not reached its
thresholds after that many evaluations stops sampling and enumerates the rest of the 2^m coalitions:
those it evaluated are not evaluated again, so such a round costs at most what exact values cost, plus
the sampler's arithmetic. The stopping rule reads only the game's utilities, never the clock, so
valuing the same round again gives the same values.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any

import numpy as np

from fedsv.valuation.estimators.budget import minimum_budget
from fedsv.valuation.estimators.estimator import Estimator, Outcome, Settings
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.estimators.noise_target import FoldReplay, FoldRun, thresholds, validation_noise
from fedsv.valuation.estimators.result import ValuationResult
from fedsv.valuation.games.game import FloatArray, Game

logger = logging.getLogger(__name__)

FALLBACK_STDERR = 0.002
"""The standard error a target samples to where nothing else says: two validation images in a thousand
for an accuracy utility (the run's --valuation-target-stderr default; under a noise target, a game with
no validation folds)."""

FIRST_BUDGET_PER_PLAYER = 16
"""The first attempt's budget: the border plus this many evaluations per player."""

GROWTH = 1.5
"""Each attempt brings the distinct evaluations to this multiple of those before. A run stops at most
this factor past the evaluations its target needed, (GROWTH - 1) / ln(GROWTH) = 1.23 times them on
average (before, each attempt doubled the one before: 16 m, then 48 m, 112 m, ...). More attempts are more
looks at a noisy standard error, so a finer growth would stop early on an underestimate more often:
the coverage tests (test_accuracy_target) hold at 1.5."""


def first_allowance(m: int) -> int:
    """The evaluations of a target's first attempt on a game of m players."""
    return max(minimum_budget(m) + FIRST_BUDGET_PER_PLAYER * m, 2)


def reached(stderr: np.ndarray | None, target: float | np.ndarray) -> bool:
    """True when every standard error is known (finite) and at most its `target` (one, or one each)."""
    return stderr is not None and bool(np.all(np.isfinite(stderr)) and np.all(stderr <= target))


class ToTarget(Estimator):
    """`sampler` (a budgeted method) run to a standard error of at most `target` for every value (or
    `noise_fraction` of its validation noise), within `cap` distinct evaluations, finishing exact after
    `exact_after` evaluations if given. The result's method is the sampler's, or "exact" where it
    finished exact; extra["target"] says whether the target was reached, with how many attempts and
    what budgets."""

    def __init__(
        self,
        sampler: type[Estimator],
        settings: Settings,
        target: float,
        cap: int,
        noise_fraction: float | None = None,
        exact_after: int | None = None,
        fold_base: FloatArray | None = None,
    ) -> None:
        if not sampler.sampling:
            raise ValueError(f"{sampler.method} does not sample: it has no budget to grow")
        if not (np.isfinite(target) and target > 0):
            raise ValueError(f"the target standard error must be a positive number, got {target}")
        if noise_fraction is not None and not (np.isfinite(noise_fraction) and noise_fraction > 0):
            raise ValueError(f"the noise fraction must be a positive number, got {noise_fraction}")
        self.sampler, self.settings, self.target, self.cap = sampler, settings, float(target), int(cap)
        self.noise_fraction, self.exact_after = noise_fraction, exact_after
        self.fold_base = fold_base  # values per fold the game lacks (a surrogate's: surrogate.py), (m, folds)

    def with_fold_base(self, fold_base: FloatArray) -> ToTarget:
        """This target on a game whose values per validation fold lack `fold_base` (m, folds): the noise
        is read from the sampler's fold values plus it."""
        clone = copy.copy(self)
        clone.fold_base = fold_base
        return clone

    def run(self, game: Game) -> ValuationResult:
        result = super().run(game)
        exact = bool(result.extra.get("target", {}).get("finished_exact"))
        return dataclasses.replace(result, method="exact" if exact else self.sampler.method)

    def estimate(self, game: Game) -> Outcome:
        m, start = game.m, game.evaluations
        cap = min(self.cap, 2**m)
        allowance = min(cap, first_allowance(m))
        replay = FoldReplay(game, self.sampler, self.settings) if self.noise_fraction is not None else None
        folds = replay if replay is not None and replay.available else None
        attempts, allowances, fold_run = 0, [], None
        while True:
            attempts += 1
            allowances.append(allowance)
            # an attempt may evaluate `allowance` new coalitions; those of earlier attempts are free
            result = self.sampler.configured(allowance, self.settings).run(game)
            fold_run = folds.attempt(allowance) if folds is not None else None  # keeps pace with the game
            if fold_run is not None and self.fold_base is not None:
                fold_run = dataclasses.replace(fold_run, values=fold_run.values + self.fold_base)
            limits = self._limits(fold_run, result)
            spent = game.evaluations - start
            ok = reached(result.stderr, limits)
            if result.stderr is not None and logger.isEnabledFor(logging.DEBUG):
                ratios = result.stderr / np.maximum(limits, 1e-300)
                logger.debug("attempt %d: %d evaluations, largest stderr / threshold %.3g (player %d)",
                             attempts, spent, float(np.max(ratios)), int(np.argmax(ratios)))  # fmt: skip
            if ok or spent >= 2**m or (self.exact_after is not None and spent >= self.exact_after):
                break
            left = cap - spent
            if left < minimum_budget(m):
                break
            allowance = min(max(math.ceil((GROWTH - 1) * spent), minimum_budget(m)), left)
        finish_exact = not ok and self.exact_after is not None and spent >= self.exact_after
        if finish_exact:  # the coalitions sampled so far are in the game's memo: only the rest cost
            result = ExactShapley(max(m, self.settings.max_exact_players)).run(game)
            spent = game.evaluations - start
        worst = float(np.max(result.stderr)) if result.stderr is not None else 0.0
        logger.debug("%s to its target: %d attempts, %d evaluations, largest stderr %g%s",
                     self.sampler.method, attempts, spent, worst,
                     ", then exact" if finish_exact else "")  # fmt: skip
        target: dict[str, Any] = {
            "stderr": self.target,
            "noise_fraction": self.noise_fraction,
            "thresholds": np.asarray(limits).tolist(),  # one per value, or one for all
            "reached": ok,
            "finished_exact": finish_exact,
            "attempts": attempts,
            "evaluations": spent,
            "cap": self.cap,
            "allowances": allowances,  # each attempt's budget: what a replay needs (by_class)
            # the sampler's values on each validation fold (m, folds), what by_class would replay for
            "fold_values": None if fold_run is None or finish_exact else fold_run.values,
        }
        return Outcome.of(result, {**result.extra, "target": target})

    def _limits(self, fold_run: FoldRun | None, result: ValuationResult) -> FloatArray | float:
        """Each value's threshold after this attempt: `target`, or with the attempt's values on the
        validation folds, its noise fraction of each value's validation noise."""
        if fold_run is None or self.noise_fraction is None:
            return self.target
        stderr = np.zeros(result.values.shape) if result.stderr is None else result.stderr
        noise = validation_noise(fold_run, stderr)
        dof = fold_run.shares.shape[0] - 1
        return thresholds(noise, self.noise_fraction, self.target, dof, fold_run.values.sum(axis=1))
