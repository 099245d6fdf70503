"""Stratified SVARM: Shapley values from per-size means of U, not marginals (Kolpaczki et al. 2024)."""

from __future__ import annotations

from fedsv.valuation.estimators.border import Border, interior_sizes
from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.estimators.estimator import Outcome, StratifiedEstimator
from fedsv.valuation.estimators.strata import StratumMeans, sample_strata


class StratifiedSVARM(StratifiedEstimator):
    """Stratified SVARM within a budget of distinct evaluations.

    The border sizes (0, 1, m-1, m, and 2, m-2, ... while they take at most half the budget) are
    evaluated exactly; the other sizes are sampled with p(s) proportional to 1/sqrt(s (m-s)) and
    every sampled coalition updates the (size, in/out) stratum of every player. Values are shifted to
    sum to U(all) - U(empty). With budget >= 2^m every stratum is exact and so are the values.
    """

    method = "svarm"

    def from_border(self, budget: EvaluationBudget, border: Border) -> Outcome:
        strata = StratumMeans(budget.game.m, resolution=budget.game.resolution)
        strata.add_exact(border.rows, border.utilities)
        rows, utilities = sample_strata(budget, interior_sizes(budget.game.m, border.sizes), self.rng())
        strata.add(rows, utilities)
        estimate = strata.estimate()
        return Outcome(estimate.values, estimate.stderr, samples=int(rows.shape[0]))
