"""GTG-Shapley (Liu, Chen, Yang, Zhou, Zhao 2022): truncated, guided permutation sampling for FL rounds.

"GTG-Shapley: Efficient and Accurate Participant Contribution Evaluation in Federated Learning",
ACM TIST 13(4), 2022 (arXiv:2109.02053), the contribution estimator FedML ships as GTGShapleyValue.
Its savings over plain permutation sampling come from two truncations:

- between rounds: a round whose utility barely moved (|U(N) - U(empty)| <= between_tolerance) is
  worth nothing to anyone, so every value is 0 and only U(empty), U(N) are evaluated;
- within a round: walking a permutation, once its prefix is within `within_tolerance` of U(N) the
  players after it are credited 0 and their prefixes are never evaluated;

and from guided sampling: the permutations come in blocks of m in which every player stands first
once (the first position carries the largest marginals, U({i}) - U(empty)).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.estimators.estimator import BudgetedEstimator, Outcome, ends
from fedsv.valuation.estimators.monte_carlo import MAX_BUDGETED_SAMPLES, STALL_BATCHES, RunningMoments
from fedsv.valuation.estimators.permutation import balanced_permutations
from fedsv.valuation.games.game import Game

logger = logging.getLogger(__name__)

WITHIN_TOLERANCE = 0.001
"""FedML's `eps`: a prefix within this of U(N) truncates the rest of its permutation."""

BETWEEN_TOLERANCE = 0.01
"""FedML's `round_trunc_threshold`: a round with |U(N) - U(empty)| <= this is valued 0 for everyone."""

CONVERGENCE = 0.05
"""FedML's `CONVERGE_CRITERIA`: the largest mean relative change of the running values allowed over
the last LAST_K permutations."""

LAST_K = 10
"""FedML's `last_k`: the window of permutations the convergence test looks back over."""

MIN_PERMUTATIONS = 30
"""FedML's `CONVERGE_MIN_K` (3 * 10): convergence is tested only after more permutations than this."""


def _check_tolerance(value: float, what: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a finite number >= 0, got {value}")
    return float(value)


class GTGShapley(BudgetedEstimator):
    """GTG-Shapley values within a hard budget of distinct utility evaluations.

    budget: distinct evaluations this run may cause (U(empty) and U(N) included); an integer >= 2.
        `result.evaluations <= budget` always.
    seed: the permutations drawn (the result is deterministic per seed).
    within_tolerance: within-round truncation. Walking a permutation, player j's prefix is evaluated
        only while |U(N) - U(prefix of the players before j)| >= within_tolerance (FedML's test);
        after that the remaining players' marginals are 0. 0 disables it. Absolute, in the
        utility's units (FedML's utility is test accuracy in [0, 1]); default 0.001, FedML's `eps`.
    between_tolerance: between-round truncation: if |U(N) - U(empty)| <= between_tolerance every value
        is 0. Absolute; default 0.01, FedML's `round_trunc_threshold`.
    convergence: sampling stops once more than `min_permutations` permutations were walked and, for
        each of the running values after the last `last_k` permutations, the mean over players of
        |running - latest| / (|latest| + 1e-12) is at most `convergence` (FedML's `_is_not_converged`;
        default 0.05 over the last 10, after more than 30, FedML's CONVERGE_CRITERIA, last_k and
        CONVERGE_MIN_K). It is tested after each block of m permutations, as FedML does. 0 stops
        only once the running values no longer change at all; otherwise the budget or the sampling
        caps end the run.

    Permutations come in blocks of m (balanced_permutations(): a random ordering of all m players
    decides who stands first) and are walked position by position, one batched evaluation per
    position across as many permutations as the remaining budget surely pays for (m - 1 new prefixes
    each), one at a time near the end. The budget ends sampling when a prefix that is due no longer
    fits: that permutation is discarded (its evaluations stay counted). Sampling also stops after
    MAX_BUDGETED_SAMPLES permutations, or after STALL_BATCHES blocks in a row without a new
    evaluation (every coalition they needed was cached; 50 m permutations for nothing).

    Departures from FedML: marginals are not clipped at 0 (FedML credits max(v_j - v_{j-1}, 0), which
    biases every value upward); the first players of a block are shuffled instead of cycling in
    index order, so a block cut short by the budget favours no one; if no permutation fits the budget,
    every player gets (U(N) - U(empty)) / m (stderr NaN, samples 0).

    The values are not exactly efficient: a truncated permutation's marginals sum to
    U(prefix) - U(empty), within within_tolerance of U(N) - U(empty).
    """

    method = "gtg"

    def __init__(
        self,
        budget: int,
        seed: int = 0,
        within_tolerance: float = WITHIN_TOLERANCE,
        between_tolerance: float = BETWEEN_TOLERANCE,
        convergence: float = CONVERGENCE,
        last_k: int = LAST_K,
        min_permutations: int = MIN_PERMUTATIONS,
    ) -> None:
        super().__init__(budget, seed)
        self.within_tolerance = _check_tolerance(within_tolerance, "within_tolerance")
        self.between_tolerance = _check_tolerance(between_tolerance, "between_tolerance")
        self.convergence = _check_tolerance(convergence, "convergence")
        if isinstance(last_k, bool) or not isinstance(last_k, int) or last_k < 2:
            raise ValueError(f"last_k must be an integer >= 2, got {last_k!r}")
        if (
            isinstance(min_permutations, bool)
            or not isinstance(min_permutations, int)
            or min_permutations < 0
        ):
            raise ValueError(f"min_permutations must be an integer >= 0, got {min_permutations!r}")
        self.last_k = last_k
        self.min_permutations = min_permutations

    def single_player(self, game: Game) -> Outcome:
        return self.estimate(game)  # the round's truncation applies to one player too

    def estimate(self, game: Game) -> Outcome:
        m = game.m
        budget = EvaluationBudget(game, self.budget)
        empty, grand = ends(game, budget)
        extra: dict[str, Any] = {
            "truncated": False,
            "tolerances": {"within": self.within_tolerance, "between": self.between_tolerance},
            "convergence": self.convergence,
            "budget": self.budget,
        }

        def result(values: npt.NDArray[np.float64], stderr: npt.NDArray[np.float64], samples: int) -> Outcome:
            return Outcome(values, stderr, empty, grand, samples, extra)

        if abs(grand - empty) <= self.between_tolerance:
            extra.update(truncated=True, converged=True, budget_exhausted=False, skipped_prefixes=0)
            logger.debug("gtg: round truncated, |U(N) - U(empty)| = %g", abs(grand - empty))
            return result(np.zeros(m), np.zeros(m), 0)
        if m == 1:
            extra.update(converged=True, budget_exhausted=False, skipped_prefixes=0)
            return result(np.array([grand - empty]), np.zeros(1), 0)

        rng = self.rng()
        stats = RunningMoments(m)
        total = np.zeros(m)
        recent: deque[npt.NDArray[np.float64]] = deque(maxlen=self.last_k)
        skipped = stalled = 0
        converged = exhausted = False
        while stats.count < MAX_BUDGETED_SAMPLES and stalled < STALL_BATCHES:
            used = budget.used
            block = balanced_permutations(min(m, MAX_BUDGETED_SAMPLES - stats.count), m, rng)
            start = 0
            while start < block.shape[0] and not exhausted:
                # walk as many permutations at once as the budget surely pays for (m - 1 new prefixes
                # each at worst), else one at a time, so that the budget's end strands at most one
                chunk = max(1, min(block.shape[0] - start, budget.remaining // (m - 1)))
                perms = block[start : start + chunk]
                start += chunk
                credited, finished, chunk_skipped = self._walk(perms, budget, empty, grand)
                skipped += chunk_skipped
                exhausted = not finished.all()
                kept = credited[finished]
                if kept.shape[0]:
                    stats.add(kept)
                    sums = total + np.cumsum(kept, axis=0)
                    total = sums[-1]
                    recent.extend(sums / np.arange(stats.count - kept.shape[0] + 1, stats.count + 1)[:, None])
            if exhausted:
                break
            stalled = stalled + 1 if budget.used == used else 0
            if self._converged(stats.count, recent):
                converged = True
                break
        extra.update(converged=converged, budget_exhausted=exhausted, skipped_prefixes=skipped)
        logger.debug("gtg: %d permutations of %d players, %d prefixes truncated", stats.count, m, skipped)
        if stats.count == 0:
            logger.warning("gtg: budget %d pays for no permutation of %d players", self.budget, m)
            return result(np.full(m, (grand - empty) / m), np.full(m, np.nan), 0)
        return result(stats.mean.copy(), stats.stderr(), stats.count)

    def _walk(
        self, perms: npt.NDArray[np.int64], budget: EvaluationBudget, empty: float, grand: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], int]:
        """Walk permutations (rows) position by position, one batched evaluation per position.

        Returns the marginals credited to players (rows: permutations), which permutations were
        finished (the others hit the budget), and how many prefix evaluations truncation skipped.
        """
        count, m = perms.shape
        values = np.empty((count, m + 1))
        values[:, 0] = empty
        members = np.zeros((count, m), dtype=bool)
        finished = np.ones(count, dtype=bool)
        rows = np.arange(count)
        skipped = 0
        for j in range(1, m + 1):
            members[rows, perms[:, j - 1]] = True
            values[:, j] = values[:, j - 1]  # truncated (or unfinished): the marginal is 0
            due = finished & (np.abs(grand - values[:, j - 1]) >= self.within_tolerance)
            if j == m:
                values[due, j] = grand  # the whole coalition: already evaluated
                break
            skipped += int(np.count_nonzero(finished & ~due))
            index = np.flatnonzero(due)
            if index.size == 0:
                continue
            fits = budget.fit(members[index])
            finished[index[fits:]] = False
            if fits:
                values[index[:fits], j] = budget.utilities(members[index[:fits]])
        marginals = np.diff(values, axis=1)  # marginals[t, i] belongs to player perms[t, i]
        credited = np.empty_like(marginals)
        np.put_along_axis(credited, perms, marginals, axis=1)
        return credited, finished, skipped

    def _converged(self, count: int, recent: deque[npt.NDArray[np.float64]]) -> bool:
        """FedML's test: after more than min_permutations permutations, the running values of the last
        last_k permutations all lie within `convergence` (mean relative change) of the latest."""
        if count <= self.min_permutations or len(recent) < self.last_k:
            return False
        history = np.stack(list(recent))
        latest = history[-1]
        errors = np.mean(np.abs(history - latest) / (np.abs(latest) + 1e-12), axis=1)
        return bool(np.max(errors) <= self.convergence)
