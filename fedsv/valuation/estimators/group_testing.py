"""Group-testing Shapley estimator (Jia et al. 2019) with efficiency-based recovery instead of a pivot."""

from __future__ import annotations

import logging
import math

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.estimator import Settings
from fedsv.valuation.estimators.monte_carlo import (
    BUDGETED_BATCH,
    STALL_BATCHES,
    Draws,
    MonteCarloEstimator,
    RunningMoments,
    check_accuracy,
)

logger = logging.getLogger(__name__)

_MAX_BATCH_CELLS = 2**26
"""Membership cells (rows * m) built and evaluated per batch."""


def harmonic_z(m: int) -> float:
    """Z = 2 * sum_{k=1}^{m-1} 1/k, the normalizer of the size distribution (0 for m = 1)."""
    return 2.0 * math.fsum(1.0 / k for k in range(1, m))


def size_distribution(m: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], float]:
    """Sizes k = 1..m-1, their probabilities q(k) = (1/Z)(1/k + 1/(m-k)) (summing to 1), and Z."""
    if m < 2:
        raise ValueError(f"group testing needs at least two players to draw sizes from, got m={m}")
    ks = np.arange(1, m, dtype=np.int64)
    z = harmonic_z(m)
    q = (1.0 / ks + 1.0 / (m - ks)) / z
    return ks, q / q.sum(), z


def group_testing_budget(m: int, eps: float, delta: float, utility_range: float = 1.0) -> int:
    """Tests T for an (eps, delta)-approximation of every player's value (0 for m = 1: no tests).

    The estimate of s_i is (U(N) - U(empty))/m + mean_t Y_ti with Y_ti = Z B_t (beta_ti - k_t/m),
    B_t = U(S_t) - U(empty) in [-r, r]. Hence |Y| <= Z r, |Y - E Y| <= 2 Z r and
    Var Y <= E Y^2 <= Z^2 r^2 sum_k q(k) (k/m)(1 - k/m) = Z r^2 (m-1)/m =: sigma^2.
    Bernstein: P(|mean - E Y| >= eps) <= 2 exp(-T eps^2 / (2 sigma^2 + (2/3)(2 Z r) eps)) = delta/m,
    and a union bound over the m players gives delta.
    """
    check_accuracy(eps, delta, utility_range)
    if m < 1:
        raise ValueError(f"a game needs at least one player, got m={m}")
    if m == 1:
        return 0
    z, r = harmonic_z(m), utility_range
    sigma2 = z * r**2 * (m - 1) / m
    return math.ceil((2 * sigma2 + (2.0 / 3.0) * (2 * z * r) * eps) / eps**2 * math.log(2 * m / delta))


def draw_tests(
    m: int, count: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Draw `count` tests: sizes k_t ~ q, then uniformly random subsets of size k_t (rows, (count, m))."""
    ks, q, _ = size_distribution(m)
    sizes = rng.choice(ks, size=count, p=q)
    ranks = np.argsort(np.argsort(rng.random((count, m)), axis=1), axis=1)  # a random permutation per row
    return sizes, ranks < sizes[:, None]


class GroupTesting(MonteCarloEstimator):
    """Shapley values from group tests: unbiased pairwise differences plus the efficiency constraint.

    s_i = (U(N) - U(empty))/m + Z/(m T) sum_t B_t (m beta_ti - k_t), exactly efficient by construction.

    How many tests: without `budget`, `count` if given, else the Bernstein count group_testing_budget()
    for the (eps, delta) target; with `budget`, as MonteCarloEstimator says. With no test at all every
    player gets (U(N) - U(empty)) / m.
    """

    method = "group_testing"
    sample_name = "tests"

    @classmethod
    def planned_evaluations(cls, m: int, budget: int, settings: Settings) -> int:
        if settings.capped:
            return budget
        # without a budget, group testing draws its own Bernstein count of tests (one coalition each)
        return min(2**m, 2 + group_testing_budget(m, settings.eps, settings.delta, settings.utility_range))

    def count_for(self, m: int) -> int:
        return group_testing_budget(m, self.eps, self.delta, self.utility_range)

    def sample(self, draws: Draws) -> None:
        game, budget, stats, empty = draws.game, draws.budget, draws.stats, draws.empty
        m = game.m
        z = harmonic_z(m)
        total = self.sample_count(m)
        per_batch = max(1, _MAX_BATCH_CELLS // m)
        stalled = 0
        while stats.count < total and stalled < STALL_BATCHES:
            count = min(per_batch, total - stats.count)
            if budget is not None:
                count = min(count, max(BUDGETED_BATCH, budget.remaining))
            sizes, members = draw_tests(m, count, draws.rng)
            used = game.evaluations
            fits = count if budget is None else budget.fit(members)
            if fits:
                utilities = (
                    game.utilities(members[:fits]) if budget is None else budget.utilities(members[:fits])
                )
                centred = utilities - empty  # B_t
                stats.add(z * centred[:, None] * (members[:fits] - sizes[:fits, None] / m))  # Y_ti
            if fits < count:
                break  # the next test's coalition overruns the budget
            if budget is not None:
                stalled = stalled + 1 if game.evaluations == used else 0
        logger.debug("group testing: %d tests of %d players", stats.count, m)

    def values(
        self, stats: RunningMoments, empty: float, grand: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        return (grand - empty) / stats.mean.shape[0] + stats.mean, stats.stderr()
