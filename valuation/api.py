"""Functional API: shapley_values() for any utility, and plan() of the evaluation cost per method."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

from fedsv.valuation.exact import ExactShapley
from fedsv.valuation.game import Game, as_game
from fedsv.valuation.group_testing import GroupTesting, group_testing_budget
from fedsv.valuation.loo import LeaveOneOut, RandomValues
from fedsv.valuation.permutation import PermutationSampling, permutation_budget
from fedsv.valuation.result import ValuationResult
from fedsv.valuation.spec import SHAPLEY_METHODS, ValuationSpec

logger = logging.getLogger(__name__)


class Estimator(Protocol):
    """Anything with run(game) -> ValuationResult."""

    def run(self, game: Game) -> ValuationResult: ...


def _check_players(m: int) -> int:
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"a game needs at least one player, got m={m}")
    return int(m)


def plan(m: int, spec: ValuationSpec | None = None) -> dict[str, int]:
    """Planned distinct utility evaluations per Shapley method for a game of m players.

    exact: 2^m (present only if m <= spec.max_exact_players); permutation: min(2^m, 2 + T_perm (m-1))
    (every permutation's full prefix is U(all), so m-1 new coalitions per permutation);
    group_testing: min(2^m, 2 + T_gt) (one coalition per test plus U(empty) and U(all)).
    """
    spec = spec or ValuationSpec()
    m = _check_players(m)
    full = 2**m
    costs: dict[str, int] = {}
    if m <= spec.max_exact_players:
        costs["exact"] = full
    per_permutation = m - 1
    permutations = permutation_budget(m, spec.eps, spec.delta, spec.utility_range)
    costs["permutation"] = min(full, 2 + permutations * per_permutation)
    costs["group_testing"] = min(full, 2 + group_testing_budget(m, spec.eps, spec.delta, spec.utility_range))
    return costs


def choose_method(costs: dict[str, int]) -> str:
    """The cheapest planned method; exact wins ties, then permutation."""
    order = [name for name in SHAPLEY_METHODS if name in costs]
    return min(order, key=lambda name: (costs[name], order.index(name)))


def make_estimator(m: int, spec: ValuationSpec) -> Estimator:
    """The estimator object for spec.method ("auto" resolved with plan() for m players)."""
    method = spec.method
    if method == "auto":
        costs = plan(m, spec)
        method = choose_method(costs)
        logger.info("auto: m=%d planned evaluations %s -> %s", m, costs, method)
    if method == "exact":
        return ExactShapley(spec.max_exact_players)
    if method == "permutation":
        return PermutationSampling(spec.eps, spec.delta, spec.utility_range, seed=spec.seed)
    if method == "group_testing":
        return GroupTesting(spec.eps, spec.delta, spec.utility_range, seed=spec.seed)
    if method == "loo":
        return LeaveOneOut()
    return RandomValues(spec.seed)


def shapley_values(
    utility: Game | Callable[[frozenset[int]], float],
    m: int | None = None,
    spec: ValuationSpec | None = None,
) -> ValuationResult:
    """Values of the m players of `utility` (a Game, or a callable on frozensets of indices 0..m-1).

    `spec` (default ValuationSpec(): "auto", eps = delta = 0.05) says which method and what accuracy.
    The result's `.method` is the method actually used; `.evaluations` counts the distinct coalitions
    this call evaluated.
    """
    spec = spec or ValuationSpec()
    if m is not None:
        m = _check_players(m)
    game = as_game(utility, m)
    result = make_estimator(game.m, spec).run(game)
    if spec.method == "auto":
        costs = plan(game.m, spec)
        result = dataclasses.replace(result, extra={**result.extra, "requested": "auto", "plan": costs})
    return result
