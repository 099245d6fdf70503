"""ValuationSpec: which estimator values a game, with what budget or accuracy, with which seed."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fedsv.valuation.estimators.budget import check_budget
from fedsv.valuation.estimators.estimator import Settings
from fedsv.valuation.estimators.exact import HARD_MAX_PLAYERS
from fedsv.valuation.estimators.methods import METHODS, SAMPLING_METHODS, SHAPLEY_METHODS
from fedsv.valuation.estimators.monte_carlo import check_accuracy

__all__ = ["METHODS", "SAMPLING_METHODS", "SHAPLEY_METHODS", "ValuationSpec", "check_method"]


def _positive(value: object) -> bool:
    return (
        not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    )


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")


@dataclass(frozen=True)
class ValuationSpec:
    """How to value a game; checked on construction.

    method: one of METHODS; "auto" is exact when all 2^m coalitions fit the budget, else the sampling
        method the estimator benchmark found most accurate (see api.plan()).
    budget: distinct utility evaluations a sampling method may cause, never exceeded.
    budget_seconds: a time budget; the cost of one evaluation is measured on the game itself (the
        border coalitions are evaluated first and timed), and the evaluation budget is capped at
        budget_seconds / that cost. "auto" picks exact only if 2^m evaluations fit.
    eps, delta, utility_range: without `budget`, the budget is the evaluations that permutation
        sampling needs for P(max_i |s_i_hat - s_i| <= eps) >= 1 - delta by Hoeffding, valid when
        max U - min U <= utility_range. That guarantee is proved for "permutation" and
        "group_testing" only; docs/estimators.md gives the coverage measured for the others.
    target_stderr: an accuracy target instead of a budget (absolute, in the utility's units): a
        sampling method runs with growing budgets until every value's standard error is at most this
        (target.ToTarget), within `max_evaluations`; "auto" is exact whenever 2^m evaluations take at
        most `exact_seconds` at the cost per coalition measured on the game, else samples to the
        target. An explicit `budget` or `budget_seconds` takes precedence.
    noise_fraction: an accuracy target relative to the values' own noise: each value is sampled until
        its standard error is at most this fraction of its validation noise (noise_target.py;
        target_stderr, or 0.002, where the game has no validation folds). "auto" is then exact only
        where all coalitions take at most `exact_seconds` (or fit a sampler's first attempt); else it
        samples, finishing exact if the sampler is not there by half of the 2^m coalitions
        (api.auto_to_noise).
    exact_after: with a target, a sampler that has not reached it after this many evaluations finishes
        exact (what "auto" plans under a noise target; a replayed plan carries it).
    surrogate: with a target, the sampler is corrected by the game's cheap surrogate (a round game's
        model linearized around w_t: surrogate.SurrogateCorrected) where its first attempt finds the
        stated errors smaller with it than without.
    merge_redundant: members of a round whose updates are far more alike than independent data give
        (fedsv.fl.redundancy: a second identity with a copy of an owner's data) are valued as one
        player, their value split equally, so that joining twice does not pay twice. Off by default:
        two honest members holding the same few classes look alike too (docs/decisions/0007).
    seed: seeds the sampling methods and "random".
    max_exact_players: the largest game "exact" enumerates (and "auto" considers exact for).
    """

    method: str = "auto"
    eps: float = 0.05
    delta: float = 0.05
    seed: int = 0
    utility_range: float = 1.0
    max_exact_players: int = 20
    budget: int | None = None
    budget_seconds: float | None = None
    target_stderr: float | None = None
    noise_fraction: float | None = None
    exact_after: int | None = None
    max_evaluations: int = 100_000
    exact_seconds: float = 120.0
    surrogate: bool = True
    merge_redundant: bool = False

    def __post_init__(self) -> None:
        check_method(self.method)
        check_accuracy(self.eps, self.delta, self.utility_range)
        check_budget(self.budget)
        check_budget(self.max_evaluations, "max_evaluations")
        check_budget(self.exact_after, "exact_after")
        for name in ("budget_seconds", "target_stderr", "noise_fraction", "exact_seconds"):
            value = getattr(self, name)
            if value is not None and not _positive(value):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        for name in ("surrogate", "merge_redundant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        players = self.max_exact_players
        if isinstance(players, bool) or not isinstance(players, int) or not 1 <= players <= HARD_MAX_PLAYERS:
            raise ValueError(f"max_exact_players must be an integer in 1..{HARD_MAX_PLAYERS}, got {players}")

    @property
    def targeted(self) -> bool:
        """Sampling runs to a target, target_stderr or noise_fraction (no explicit budget or time budget
        takes precedence)."""
        target = self.target_stderr is not None or self.noise_fraction is not None
        return target and self.budget is None and self.budget_seconds is None

    def settings(self) -> Settings:
        """What a planned estimator is configured with (its evaluations come from the plan)."""
        capped = self.budget is not None or self.budget_seconds is not None
        return Settings(self.seed, self.eps, self.delta, self.utility_range, self.max_exact_players, capped)

    def with_seed(self, seed: int) -> ValuationSpec:
        """The same spec with another seed (e.g. one per round)."""
        return dataclasses.replace(self, seed=seed)
