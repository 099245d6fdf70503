"""Monte-Carlo estimators with an (eps, delta) target or a budget: the shared opening and running moments."""

from __future__ import annotations

import logging
import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.budget import EvaluationBudget, check_budget
from fedsv.valuation.estimators.estimator import Estimator, Outcome, Settings, ends
from fedsv.valuation.estimators.strata import unseen_step_variance
from fedsv.valuation.games.game import Game

logger = logging.getLogger(__name__)

MAX_BUDGETED_SAMPLES = 100_000
"""With an evaluation budget, at most this many permutations (or group tests) are drawn. Samples whose
coalitions are all cached cost no evaluation, so without a cap a budget >= 2^m would never run out."""

STALL_BATCHES = 50
"""With an evaluation budget, sampling also stops after this many consecutive batches (each at least
BUDGETED_BATCH samples) that evaluated no new coalition: the game is then cached wherever sampling goes,
and more samples only refine the average of known utilities (at least 12,800 of them were already free)."""

BUDGETED_BATCH = 256
"""With an evaluation budget, the fewest samples drawn per batch (more when the remaining budget could
pay for more): only the leading ones that fit are used, so the batch size changes speed, not results."""


def check_accuracy(eps: float, delta: float, utility_range: float) -> None:
    """Validate an (eps, delta)-approximation target and the utility range r."""
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number, got {eps}")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (math.isfinite(utility_range) and utility_range > 0):
        raise ValueError(f"utility_range must be a positive finite number, got {utility_range}")


def check_count(value: int | None, what: str) -> int | None:
    """Validate an explicit sample count (None means: use the budget)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer or None, got {value!r}")
    return int(value)


class RunningMoments:
    """Per-column mean and sum of squared deviations over batches of rows (Chan et al. merge).
    `resolution`: the samples' lattice step where they lie on one (strata.unseen_step_variance)."""

    def __init__(self, m: int, resolution: float | None = None) -> None:
        self.resolution = resolution
        self.count = 0
        self.mean = np.zeros(m)
        self.m2 = np.zeros(m)

    def add(self, rows: npt.NDArray[np.float64]) -> None:
        n = rows.shape[0]
        if n == 0:
            return
        batch_mean = rows.mean(axis=0)
        batch_m2 = ((rows - batch_mean) ** 2).sum(axis=0)
        total = self.count + n
        shift = batch_mean - self.mean
        self.mean = self.mean + shift * (n / total)
        self.m2 = self.m2 + batch_m2 + shift**2 * (self.count * n / total)
        self.count = total

    def stderr(self) -> npt.NDArray[np.float64]:
        """Sample standard deviation / sqrt(count), the variance at least that of a lattice step not
        seen; NaN with fewer than two rows."""
        if self.count < 2:
            return np.full(self.mean.shape, np.nan)
        floor = unseen_step_variance(np.full(self.mean.shape, float(self.count)), self.resolution)
        variance = np.maximum(self.m2 / (self.count - 1), floor)
        return np.asarray(np.sqrt(variance / self.count), dtype=np.float64)


@dataclass
class Draws:
    """One run's sampling: the game, its budget (None: a counted run), the generator, the running
    moments of the samples' per-player contributions, and U(empty)."""

    game: Game
    budget: EvaluationBudget | None
    rng: np.random.Generator
    stats: RunningMoments
    empty: float


class MonteCarloEstimator(Estimator):
    """Averages i.i.d. samples (permutations, group tests) for an (eps, delta) target or within a budget.

    Without `budget`: `count` samples if given, else count_for(m) (the target's concentration bound).
    With `budget` (distinct evaluations, U(empty) and U(all) included) samples are admitted in order
    while their new distinct coalitions fit, so `result.evaluations <= budget` always; sampling stops
    at the first sample that does not fit, after `count` (if given, else MAX_BUDGETED_SAMPLES) samples,
    or after STALL_BATCHES batches in a row without a new coalition.
    """

    sampling = True
    sample_name = "samples"

    def __init__(
        self,
        eps: float = 0.05,
        delta: float = 0.05,
        utility_range: float = 1.0,
        count: int | None = None,
        seed: int = 0,
        *,
        budget: int | None = None,
    ) -> None:
        check_accuracy(eps, delta, utility_range)
        self.eps, self.delta, self.utility_range = float(eps), float(delta), float(utility_range)
        self.count = check_count(count, self.sample_name)
        self.budget = check_budget(budget)
        self.seed = seed

    @classmethod
    def configured(cls, evaluations: int, settings: Settings) -> Estimator:
        budget = evaluations if settings.capped else None
        return cls(settings.eps, settings.delta, settings.utility_range, None, settings.seed, budget=budget)

    @abstractmethod
    def count_for(self, m: int) -> int:
        """Samples for the (eps, delta) target on a game of m players (no count or budget given)."""

    def sample_count(self, m: int) -> int:
        """Samples drawn for a game of m players without a budget (with one: the most drawn)."""
        if self.count is not None:
            return self.count
        if self.budget is not None:
            return MAX_BUDGETED_SAMPLES
        return self.count_for(m)

    def extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"eps": self.eps, "delta": self.delta, "utility_range": self.utility_range}
        if self.budget is not None:
            extra["budget"] = self.budget
        return extra

    def single_player(self, game: Game) -> Outcome:
        outcome = super().single_player(game)
        return Outcome(
            outcome.values, outcome.stderr, outcome.utility_empty, outcome.utility_grand, 0, self.extra()
        )

    def estimate(self, game: Game) -> Outcome:
        budget = None if self.budget is None else EvaluationBudget(game, self.budget)
        empty, grand = ends(game, budget)
        moments = RunningMoments(game.m, self.sample_resolution(game))
        draws = Draws(game, budget, np.random.default_rng(self.seed), moments, empty)
        self.sample(draws)
        stats = draws.stats
        return Outcome(*self.values(stats, empty, grand), empty, grand, stats.count, self.extra())

    def sample_resolution(self, game: Game) -> float | None:
        """The lattice step of the samples (None: not on one), for their standard errors."""
        return None

    @abstractmethod
    def sample(self, draws: Draws) -> None:
        """Draw samples into `stats` (each row: one sample's per-player contribution)."""

    def values(
        self, stats: RunningMoments, empty: float, grand: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Values and standard errors from the samples' moments."""
        return stats.mean, stats.stderr()
