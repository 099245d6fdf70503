"""Stratified SVARM: Shapley values from per-size means of U, not marginals (Kolpaczki et al. 2024)."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.border import border_sizes, coalitions_of_size, interior_sizes
from fedsv.valuation.budget import EvaluationBudget, check_budget, require_border
from fedsv.valuation.game import FloatArray, Game
from fedsv.valuation.permutation import single_player_result
from fedsv.valuation.result import ValuationResult
from fedsv.valuation.strata import Estimate, StratumMeans, sample_strata


def evaluate_border(
    budget: EvaluationBudget, strata: StratumMeans | None = None
) -> tuple[list[int], float, float]:
    """Evaluate every coalition of the border sizes (border_sizes of the budget's limit); add them to
    `strata` as exact strata when given. Returns the sizes, U(empty) and U(all)."""
    m = budget.game.m
    sizes = border_sizes(m, budget.limit)
    empty = grand = float("nan")
    for s in sizes:
        rows = coalitions_of_size(m, s)
        values = budget.utilities(rows)
        if strata is not None:
            strata.add_exact(s, rows, values)
        if s == 0:
            empty = float(values[0])
        if s == m:
            grand = float(values[0])
    return sizes, empty, grand


def efficient(values: FloatArray, gain: float) -> FloatArray:
    """Shift every value by the same amount so that they sum to `gain` = U(all) - U(empty).

    The shift's expectation is zero for an unbiased estimate (its sum is unbiased for the gain), so an
    unbiased estimator stays unbiased, and the federated SV's split of the round's gain is exact.
    """
    return np.asarray(values + (gain - float(values.sum())) / values.shape[0], dtype=np.float64)


class StratifiedSVARM:
    """Stratified SVARM within a budget of distinct evaluations.

    The border sizes (0, 1, m-1, m, and 2, m-2, ... while they take at most half the budget) are
    evaluated exactly; the other sizes are sampled with p(s) proportional to 1/sqrt(s (m-s)) and
    every sampled coalition updates the (size, in/out) stratum of every player. Values are shifted to
    sum to U(all) - U(empty). With budget >= 2^m every stratum is exact and so are the values.
    """

    method = "svarm"

    def __init__(self, budget: int, seed: int = 0) -> None:
        checked = check_budget(budget)
        assert checked is not None
        self.budget = checked
        self.seed = seed

    def run(self, game: Game) -> ValuationResult:
        m = game.m
        before = game.evaluations
        if m == 1:
            return single_player_result(game, self.method, before, {})
        require_border(self.budget, m, self.method)
        budget = EvaluationBudget(game, self.budget)
        strata = StratumMeans(m)
        sizes, empty, grand = evaluate_border(budget, strata)
        rows, utilities = sample_strata(budget, interior_sizes(m, sizes), np.random.default_rng(self.seed))
        strata.add(rows, utilities)
        estimate: Estimate = strata.estimate()
        return ValuationResult(
            values=efficient(estimate.values, grand - empty),
            evaluations=game.evaluations - before,
            method=self.method,
            stderr=estimate.stderr,
            utility_empty=empty,
            utility_grand=grand,
            samples=int(rows.shape[0]),
            extra={"border_sizes": sizes},
        )
