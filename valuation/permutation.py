"""Permutation-sampling Shapley estimator: the paper's Algorithm 2, corrected, with a Hoeffding budget."""

from __future__ import annotations

import logging
import math

import numpy as np
import numpy.typing as npt

from fedsv.valuation.game import BoolMatrix, Game
from fedsv.valuation.result import ValuationResult

logger = logging.getLogger(__name__)

_MAX_BATCH_CELLS = 2**26
"""Membership cells (rows * m) built and evaluated per batch; larger plans are split into a few batches."""


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


def permutation_budget(m: int, eps: float, delta: float, utility_range: float = 1.0) -> int:
    """Permutations T = ceil(2 r^2 / eps^2 * log(2m / delta)) for an (eps, delta)-approximation.

    Each marginal lies in [-r, r]; Hoeffding gives P(|mean - s_i| >= eps) <= 2 exp(-T eps^2 / (2 r^2))
    = delta / m per player, and a union bound over the m players gives delta.
    """
    check_accuracy(eps, delta, utility_range)
    if m < 1:
        raise ValueError(f"a game needs at least one player, got m={m}")
    return math.ceil(2 * utility_range**2 / eps**2 * math.log(2 * m / delta))


def prefix_rows(perms: npt.NDArray[np.int64]) -> BoolMatrix:
    """Rows (T*m, m): for permutation t, row t*m + i is the coalition of its first i+1 players."""
    t, m = perms.shape
    position = np.argsort(perms, axis=1)  # position[t, j] = where player j stands in permutation t
    rows = position[:, None, :] <= np.arange(m)[None, :, None]  # (T, m prefixes, m players)
    return rows.reshape(t * m, m)


def single_player_result(game: Game, method: str, before: int, extra: dict[str, float]) -> ValuationResult:
    """A one-player game needs no sampling: the value is U({0}) - U(empty), known exactly."""
    empty, grand = game.empty_and_grand()
    return ValuationResult(
        values=np.array([grand - empty]),
        evaluations=game.evaluations - before,
        method=method,
        stderr=np.zeros(1),
        utility_empty=empty,
        utility_grand=grand,
        samples=0,
        extra=extra,
    )


class RunningMoments:
    """Per-column mean and sum of squared deviations over batches of rows (Chan et al. merge)."""

    def __init__(self, m: int) -> None:
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
        """Sample standard deviation / sqrt(count); NaN with fewer than two rows."""
        if self.count < 2:
            return np.full(self.mean.shape, np.nan)
        return np.asarray(np.sqrt(self.m2 / (self.count - 1) / self.count), dtype=np.float64)


class PermutationSampling:
    """Monte-Carlo Shapley values from random permutations (Algorithm 2, corrected).

    Every permutation starts from U(empty), and the marginal of the i-th prefix is credited to the
    player standing at position i. All T*m prefixes are evaluated in batches through the game's
    cache, so the distinct evaluations never exceed 2^m.
    """

    method = "permutation"

    def __init__(
        self,
        eps: float = 0.05,
        delta: float = 0.05,
        utility_range: float = 1.0,
        permutations: int | None = None,
        seed: int = 0,
    ) -> None:
        check_accuracy(eps, delta, utility_range)
        self.eps, self.delta, self.utility_range = float(eps), float(delta), float(utility_range)
        self.permutations = check_count(permutations, "permutations")
        self.seed = seed

    def budget(self, m: int) -> int:
        """Permutations drawn for a game of m players."""
        if self.permutations is not None:
            return self.permutations
        return permutation_budget(m, self.eps, self.delta, self.utility_range)

    def run(self, game: Game) -> ValuationResult:
        m = game.m
        before = game.evaluations
        empty, grand = game.empty_and_grand()
        extra = {"eps": self.eps, "delta": self.delta, "utility_range": self.utility_range}
        if m == 1:
            return single_player_result(game, self.method, before, extra)
        t_total = self.budget(m)
        rng = np.random.default_rng(self.seed)
        stats = RunningMoments(m)
        per_batch = max(1, _MAX_BATCH_CELLS // (m * m))
        for start in range(0, t_total, per_batch):
            count = min(per_batch, t_total - start)
            perms = rng.permuted(np.tile(np.arange(m), (count, 1)), axis=1)
            utilities = game.utilities(prefix_rows(perms)).reshape(count, m)
            previous = np.concatenate([np.full((count, 1), empty), utilities[:, :-1]], axis=1)
            marginals = utilities - previous  # marginals[t, i] belongs to player perms[t, i]
            credited = np.empty_like(marginals)
            np.put_along_axis(credited, perms, marginals, axis=1)  # credited[t, j]: player j's marginal
            stats.add(credited)
        values, stderr = stats.mean, stats.stderr()
        logger.debug("permutation sampling: %d permutations of %d players", t_total, m)
        return ValuationResult(
            values=values,
            evaluations=game.evaluations - before,
            method=self.method,
            stderr=stderr,
            utility_empty=empty,
            utility_grand=grand,
            samples=t_total,
            extra=extra,
        )
