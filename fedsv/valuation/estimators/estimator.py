"""The estimator contract: a base class with the shared opening and result building, and the registry.

Every estimator is a subclass of Estimator that names its `method`; defining the class registers it
(ESTIMATORS), and every list of method names (spec.METHODS, the run config's choices) derives from the
registry. An estimator implements `estimate(game)`, returning an Outcome; `run(game)` adds what every
estimator shares: the one-player shortcut, the count of distinct evaluations, the result object.

Sampling estimators (`sampling = True`) take a budget of distinct utility evaluations and a seed
(BudgetedEstimator); stratified ones first evaluate the border sizes exactly (StratifiedEstimator).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedsv.valuation.estimators.border import Border, evaluate_border
from fedsv.valuation.estimators.budget import EvaluationBudget, check_budget, require_border
from fedsv.valuation.estimators.result import ValuationResult
from fedsv.valuation.games.game import FloatArray, Game

ESTIMATORS: dict[str, type[Estimator]] = {}
"""Method name -> estimator class, as defined (fedsv.valuation.estimators.methods lists them in order)."""


@dataclass(frozen=True)
class Settings:
    """What a planned estimator is configured with besides its evaluations (ValuationSpec.settings()).

    capped: the evaluations are an explicit budget (a number or a time), which also caps the samplers
    that otherwise size themselves by their (eps, delta) bound (permutation, group testing).
    """

    seed: int = 0
    eps: float = 0.05
    delta: float = 0.05
    utility_range: float = 1.0
    max_exact_players: int = 20
    capped: bool = False


@dataclass(frozen=True)
class Outcome:
    """What an estimator found: values, their standard errors (None: deterministic), U(empty), U(all),
    the samples drawn and anything else worth keeping (ValuationResult.extra)."""

    values: FloatArray
    stderr: FloatArray | None
    utility_empty: float = float("nan")
    utility_grand: float = float("nan")
    samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, result: ValuationResult, extra: dict[str, Any]) -> Outcome:
        """What another estimator's `result` found, with `extra` for its extra (a wrapper's outcome)."""
        return cls(
            result.values, result.stderr, result.utility_empty, result.utility_grand, result.samples, extra
        )


class Estimator(ABC):
    """Values the players of a game. Subclasses set `method` and implement `estimate`.

    sampling: takes a budget of distinct evaluations (and a seed) and samples coalitions.
    shapley: estimates the Shapley value (False for the baselines, leave-one-out and random).
    """

    method: ClassVar[str] = ""
    sampling: ClassVar[bool] = False
    shapley: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.method:
            if cls.method in ESTIMATORS:
                raise TypeError(f"two estimators are named {cls.method!r}")
            ESTIMATORS[cls.method] = cls

    @classmethod
    def configured(cls, evaluations: int, settings: Settings) -> Estimator:
        """The estimator that carries out a plan of `evaluations` distinct evaluations."""
        return cls()

    @classmethod
    def planned_evaluations(cls, m: int, budget: int, settings: Settings) -> int:
        """The distinct evaluations a plan allots this method on m players, given the spec's budget."""
        return budget

    def run(self, game: Game) -> ValuationResult:
        """The values of `game`'s players and what they cost (distinct coalitions evaluated)."""
        before = game.evaluations
        outcome = self.single_player(game) if game.m == 1 and self.shapley else self.estimate(game)
        return ValuationResult(
            values=np.asarray(outcome.values, dtype=np.float64),
            evaluations=game.evaluations - before,
            method=self.method,
            stderr=outcome.stderr,
            utility_empty=outcome.utility_empty,
            utility_grand=outcome.utility_grand,
            samples=outcome.samples,
            extra=outcome.extra,
        )

    @abstractmethod
    def estimate(self, game: Game) -> Outcome:
        """The estimate on a game of at least two players (one player: see single_player)."""

    def single_player(self, game: Game) -> Outcome:
        """A one-player game needs no sampling: the value is U({0}) - U(empty), known exactly."""
        empty, grand = game.empty_and_grand()
        return Outcome(np.array([grand - empty]), np.zeros(1), empty, grand)


class BudgetedEstimator(Estimator):
    """A sampling estimator within `budget` distinct evaluations, its draws seeded by `seed`."""

    sampling = True

    def __init__(self, budget: int, seed: int = 0) -> None:
        checked = check_budget(budget)
        if checked is None:
            raise ValueError(
                f"{self.method} needs a budget of distinct utility evaluations (an integer >= 2)"
            )
        self.budget = checked
        self.seed = int(seed)

    @classmethod
    def configured(cls, evaluations: int, settings: Settings) -> Estimator:
        return cls(evaluations, seed=settings.seed)

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def ends(game: Game, budget: EvaluationBudget | None) -> tuple[float, float]:
    """U(empty) and U(all), through the budget when there is one."""
    rows = np.zeros((2, game.m), dtype=bool)
    rows[1] = True
    utilities = game.utilities(rows) if budget is None else budget.utilities(rows)
    return float(utilities[0]), float(utilities[1])


class StratifiedEstimator(BudgetedEstimator):
    """A budgeted estimator that evaluates the border sizes exactly first (border.border_sizes), then
    samples the interior sizes; the values are shifted to sum to U(all) - U(empty)."""

    def estimate(self, game: Game) -> Outcome:
        require_border(self.budget, game.m, self.method)
        budget = EvaluationBudget(game, self.budget)
        border = evaluate_border(budget)
        outcome = self.from_border(budget, border)
        gain = border.grand - border.empty
        return Outcome(
            efficient(outcome.values, gain),
            outcome.stderr,
            border.empty,
            border.grand,
            outcome.samples,
            {"border_sizes": border.sizes, **outcome.extra},
        )

    @abstractmethod
    def from_border(self, budget: EvaluationBudget, border: Border) -> Outcome:
        """Values (before the efficiency shift) from the exact border and what the rest of the budget buys."""


def efficient(values: FloatArray, gain: float) -> FloatArray:
    """Shift every value by the same amount so that they sum to `gain` = U(all) - U(empty).

    The shift's expectation is zero for an unbiased estimate (its sum is unbiased for the gain), so an
    unbiased estimator stays unbiased, and the federated SV's split of the round's gain is exact.
    """
    return np.asarray(values + (gain - float(values.sum())) / values.shape[0], dtype=np.float64)
