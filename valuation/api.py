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
from fedsv.valuation.permutation import PermutationSampling, check_accuracy, permutation_budget
from fedsv.valuation.result import ValuationResult

logger = logging.getLogger(__name__)

METHODS = ("auto", "exact", "permutation", "group_testing", "loo", "random")
SHAPLEY_METHODS = ("exact", "permutation", "group_testing")


class Estimator(Protocol):
    """Anything with run(game) -> ValuationResult."""

    def run(self, game: Game) -> ValuationResult: ...


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")


def plan(
    m: int,
    eps: float = 0.05,
    delta: float = 0.05,
    utility_range: float = 1.0,
    max_exact_players: int = 20,
) -> dict[str, int]:
    """Planned distinct utility evaluations per Shapley method for a game of m players.

    exact: 2^m (present only if m <= max_exact_players); permutation: min(2^m, 2 + T_perm (m-1))
    (every permutation's full prefix is U(all), so m-1 new coalitions per permutation);
    group_testing: min(2^m, 2 + T_gt) (one coalition per test plus U(empty) and U(all)).
    """
    check_accuracy(eps, delta, utility_range)
    ExactShapley(max_exact_players)  # validates max_exact_players
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"a game needs at least one player, got m={m}")
    m = int(m)
    full = 2**m
    costs: dict[str, int] = {}
    if m <= max_exact_players:
        costs["exact"] = full
    costs["permutation"] = min(full, 2 + permutation_budget(m, eps, delta, utility_range) * (m - 1))
    costs["group_testing"] = min(full, 2 + group_testing_budget(m, eps, delta, utility_range))
    return costs


def choose_method(costs: dict[str, int]) -> str:
    """The cheapest planned method; exact wins ties, then permutation."""
    order = [name for name in SHAPLEY_METHODS if name in costs]
    return min(order, key=lambda name: (costs[name], order.index(name)))


def make_estimator(
    method: str,
    m: int,
    *,
    eps: float = 0.05,
    delta: float = 0.05,
    seed: int = 0,
    utility_range: float = 1.0,
    max_exact_players: int = 20,
) -> Estimator:
    """The estimator object for a method name ("auto" resolved with plan() for m players)."""
    check_method(method)
    check_accuracy(eps, delta, utility_range)
    if method == "auto":
        costs = plan(m, eps, delta, utility_range, max_exact_players)
        method = choose_method(costs)
        logger.info("auto: m=%d planned evaluations %s -> %s", m, costs, method)
    if method == "exact":
        return ExactShapley(max_exact_players)
    if method == "permutation":
        return PermutationSampling(eps, delta, utility_range, seed=seed)
    if method == "group_testing":
        return GroupTesting(eps, delta, utility_range, seed=seed)
    if method == "loo":
        return LeaveOneOut()
    return RandomValues(seed)


def shapley_values(
    utility: Game | Callable[[frozenset[int]], float],
    m: int | None = None,
    method: str = "auto",
    eps: float = 0.05,
    delta: float = 0.05,
    seed: int = 0,
    utility_range: float = 1.0,
    max_exact_players: int = 20,
) -> ValuationResult:
    """Values of the m players of `utility` (a Game, or a callable on frozensets of indices 0..m-1).

    method: "exact", "permutation", "group_testing", "loo", "random" or "auto" (cheapest planned
    Shapley method, see plan()). eps, delta: target P(max_i |s_i_hat - s_i| <= eps) >= 1 - delta for
    the sampling methods, valid when max U - min U <= utility_range. The result's `.method` is the
    method actually used; `.evaluations` counts the distinct coalitions this call evaluated.
    """
    check_method(method)
    check_accuracy(eps, delta, utility_range)
    if m is not None and (isinstance(m, bool) or int(m) != m or m < 1):
        raise ValueError(f"a game needs at least one player, got m={m}")
    game = as_game(utility, m)
    estimator = make_estimator(
        method,
        game.m,
        eps=eps,
        delta=delta,
        seed=seed,
        utility_range=utility_range,
        max_exact_players=max_exact_players,
    )
    result = estimator.run(game)
    if method == "auto":
        costs = plan(game.m, eps, delta, utility_range, max_exact_players)
        result = dataclasses.replace(result, extra={**result.extra, "requested": "auto", "plan": costs})
    return result
