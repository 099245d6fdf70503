"""Stratified SVARM: Shapley values from per-size means of U, not marginals (Kolpaczki et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsv.valuation.border import border_rows, border_sizes, interior_sizes
from fedsv.valuation.budget import EvaluationBudget, check_budget, require_border
from fedsv.valuation.game import BoolMatrix, FloatArray, Game
from fedsv.valuation.permutation import single_player_result
from fedsv.valuation.result import ValuationResult
from fedsv.valuation.strata import Estimate, StratumMeans, sample_strata


@dataclass(frozen=True)
class Border:
    """The border coalitions (every coalition of `sizes`), evaluated exactly, and U(empty), U(all)."""

    sizes: list[int]
    rows: BoolMatrix
    utilities: FloatArray
    empty: float
    grand: float


def evaluate_border(budget: EvaluationBudget) -> Border:
    """Evaluate every coalition of the border sizes for the budget's limit (border.border_sizes)."""
    m = budget.game.m
    sizes = border_sizes(m, budget.limit)
    rows = border_rows(m, sizes)
    utilities = budget.utilities(rows)
    sized = rows.sum(axis=1)
    empty, grand = float(utilities[sized == 0][0]), float(utilities[sized == m][0])
    return Border(sizes, rows, utilities, empty, grand)


def begin(game: Game, limit: int, method: str) -> tuple[EvaluationBudget, Border]:
    """A stratified estimator's first step: its budget on `game`, and the border evaluated."""
    require_border(limit, game.m, method)
    budget = EvaluationBudget(game, limit)
    return budget, evaluate_border(budget)


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
        budget, border = begin(game, self.budget, self.method)
        strata = StratumMeans(m)
        strata.add_exact(border.rows, border.utilities)
        rows, utilities = sample_strata(
            budget, interior_sizes(m, border.sizes), np.random.default_rng(self.seed)
        )
        strata.add(rows, utilities)
        estimate: Estimate = strata.estimate()
        return ValuationResult(
            values=efficient(estimate.values, border.grand - border.empty),
            evaluations=game.evaluations - before,
            method=self.method,
            stderr=estimate.stderr,
            utility_empty=border.empty,
            utility_grand=border.grand,
            samples=int(rows.shape[0]),
            extra={"border_sizes": border.sizes},
        )
