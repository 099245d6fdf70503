"""Size strata of a game: per-player means of U over the coalitions of each size, and their sampler."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.games.game import BoolMatrix, FloatArray

MAX_IDLE_BATCHES = 50
"""A sampler stops after this many batches in a row that add no new coalition (the strata are exhausted)."""


@dataclass(frozen=True)
class Estimate:
    """Per-player values and their standard errors."""

    values: FloatArray
    stderr: FloatArray


class StratumMeans:
    """Running means of a utility over the coalitions of each size s that contain (in) or lack (out)
    each player i (of several games on the same coalitions at once: `columns`, the games' shape).

    The Shapley value is an equal-weight sum over sizes (Kolpaczki et al. 2024, stratified SVARM):
        s_i = 1/m sum_{s=1..m} mean_{A holds i, |A|=s} U(A) - 1/m sum_{s=0..m-1} mean_{A lacks i, |A|=s} U(A)
    A stratum filled with all its coalitions (a border size) is exact; a sampled one is a sample mean.
    """

    def __init__(self, m: int, columns: tuple[int, ...] = (), resolution: float | None = None) -> None:
        self.m, self.resolution = m, resolution
        shape, counted = (m, m + 1, *columns), (m, m + 1, *(1 for _ in columns))
        self.count_in, self.sum_in, self.sq_in = np.zeros(counted), np.zeros(shape), np.zeros(shape)
        self.count_out, self.sum_out, self.sq_out = np.zeros(counted), np.zeros(shape), np.zeros(shape)
        self.exact_sizes: set[int] = set()

    def add(self, members: BoolMatrix, values: FloatArray) -> None:
        """Add coalitions (rows) with their utilities (or residuals) to every stratum they belong to;
        `values` is (rows,), or (rows, *columns) for several games on the same coalitions at once."""
        members = np.asarray(members, dtype=bool)
        sizes = members.sum(axis=1)
        counted = self.count_in.shape[2:]
        for s in np.unique(sizes):
            pick = sizes == s
            rows = members[pick].astype(np.float64)
            v = values[pick]
            self.count_in[:, s] += rows.sum(axis=0).reshape(-1, *counted)
            self.sum_in[:, s] += rows.T @ v
            self.sq_in[:, s] += rows.T @ (v * v)
            self.count_out[:, s] += (1.0 - rows).sum(axis=0).reshape(-1, *counted)
            self.sum_out[:, s] += (1.0 - rows).T @ v
            self.sq_out[:, s] += (1.0 - rows).T @ (v * v)

    def add_exact(self, members: BoolMatrix, values: FloatArray) -> None:
        """Add ALL coalitions of the sizes in `members` (whole border strata): those strata are then
        known exactly (zero variance)."""
        self.add(members, values)
        self.exact_sizes.update(int(s) for s in np.unique(np.asarray(members, dtype=bool).sum(axis=1)))

    def estimate(self) -> Estimate:
        """Shapley values from the strata. A player's empty stratum takes the mean of all coalitions of
        that size seen (the best guess without data on that player), or 0 if there are none.

        The standard error is the root of the strata's summed variances of the mean (_variance_of_mean):
        a stratum sampled fewer than twice borrows the spread of its size's strata; a size whose spread
        was never measured makes the error unknown, stated as infinite rather than as zero."""
        m = self.m
        mean_in, var_in = _mean_var(self.count_in, self.sum_in, self.sq_in)
        mean_out, var_out = _mean_var(self.count_out, self.sum_out, self.sq_out)
        seen = self.count_in.sum(axis=0) + self.count_out.sum(axis=0)  # player-visits per size
        pooled = np.where(
            seen > 0, (self.sum_in.sum(axis=0) + self.sum_out.sum(axis=0)) / np.maximum(seen, 1), 0.0
        )
        mean_in = np.where(self.count_in > 0, mean_in, pooled[None, :])
        mean_out = np.where(self.count_out > 0, mean_out, pooled[None, :])
        values = (mean_in[:, 1:].sum(axis=1) - mean_out[:, :m].sum(axis=1)) / m
        exact = np.array([s in self.exact_sizes for s in range(m + 1)])
        se_in = _variance_of_mean(self.count_in, self.sum_in, self.sq_in, var_in, exact, self.resolution)
        se_out = _variance_of_mean(self.count_out, self.sum_out, self.sq_out, var_out, exact, self.resolution)
        stderr = np.sqrt(se_in[:, 1:].sum(axis=1) + se_out[:, :m].sum(axis=1)) / m
        return Estimate(values, stderr)


def unseen_step_variance(count: FloatArray, resolution: float | None) -> FloatArray:
    """The least variance a stratum of `count` samples of a utility on a lattice of step `resolution`
    is stated with: that of a step it did not see, at its expected rate after `count` samples without
    one (a Jeffreys prior: 1 / (2 count + 2)). Zero where the utility is not on a lattice.

    A sample variance of zero is no proof of zero spread: an accuracy whose residual against a good
    surrogate is zero on every sampled coalition can still differ by one validation sample on others.
    """
    if resolution is None:
        return np.zeros_like(count)
    rate = 0.5 / (count + 1.0)
    return np.asarray(resolution**2 * rate * (1.0 - rate), dtype=np.float64)


def _variance_of_mean(
    count: FloatArray,
    total: FloatArray,
    squares: FloatArray,
    var: FloatArray,
    exact: npt.NDArray[np.bool_],
    resolution: float | None = None,
) -> FloatArray:
    """Per stratum (player, size) the variance of its mean: var / count, 0 for exact sizes.

    A stratum with fewer than two samples has no spread of its own: it takes the pooled variance of
    every player's stratum of that size (one sample's worth when it has none and its mean is the
    pooled mean). Where no stratum of a sampled size has two samples, the variance is infinite. A
    utility on a lattice has at least the variance of a step not seen (unseen_step_variance).
    """
    pooled_count = count.sum(axis=0)
    _, pooled_var = _mean_var(pooled_count, total.sum(axis=0), squares.sum(axis=0))
    pooled_var = np.where(pooled_count >= 2, pooled_var, np.inf)
    own = np.where(count >= 2, var, pooled_var[None, :])
    own = np.maximum(own, unseen_step_variance(count, resolution))
    out = own / np.maximum(count, 1.0)
    out[:, exact] = 0.0
    return np.asarray(out, dtype=np.float64)


def _mean_var(count: FloatArray, total: FloatArray, squares: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per-stratum mean (0 where empty) and unbiased variance (0 with fewer than two samples)."""
    safe = np.maximum(count, 1.0)
    mean = np.where(count > 0, total / safe, 0.0)
    var = np.where(count > 1, (squares - count * mean * mean) / np.maximum(count - 1, 1.0), 0.0)
    return mean, np.maximum(var, 0.0)


def size_weights(m: int, sizes: list[int]) -> FloatArray:
    """Sampling probabilities of the interior sizes: p(s) proportional to 1/sqrt(s (m - s)).

    With n_s samples of size s, player i's stratum (s, in) gets n_s s/m of them and (s, out)
    n_s (m-s)/m, so Var(s_i) ~ 1/m sum_s (1/n_s) (1/s + 1/(m-s)) sigma^2; for equal stratum variances
    sum_s n_s = N is optimal at n_s proportional to sqrt(1/s + 1/(m-s)) = sqrt(m / (s (m-s))).
    """
    s = np.asarray(sizes, dtype=np.float64)
    w = 1.0 / np.sqrt(s * (m - s))
    return np.asarray(w / w.sum(), dtype=np.float64)


def random_coalitions(m: int, sizes: npt.NDArray[np.int64], rng: np.random.Generator) -> BoolMatrix:
    """One uniformly random coalition of each requested size (rows)."""
    keys = rng.random((sizes.shape[0], m))
    ranks = np.argsort(np.argsort(keys, axis=1), axis=1)
    return np.asarray(ranks < sizes[:, None], dtype=bool)


def sample_strata(
    budget: EvaluationBudget,
    sizes: list[int],
    rng: np.random.Generator,
    batch: int = 256,
) -> tuple[BoolMatrix, FloatArray]:
    """Coalitions of the given sizes, drawn (with replacement: p(size) by size_weights(), then uniform
    within the size) until the budget's new evaluations are spent or the strata are exhausted.
    Returns every drawn coalition (repeats included: each is one sample) and its utility."""
    m = budget.game.m
    drawn: list[BoolMatrix] = []
    utilities: list[FloatArray] = []
    if not sizes:
        return np.zeros((0, m), dtype=bool), np.zeros(0)
    p = size_weights(m, sizes)
    choices = np.asarray(sizes, dtype=np.int64)
    idle = 0
    while budget.remaining > 0 and idle < MAX_IDLE_BATCHES:
        rows = random_coalitions(m, rng.choice(choices, size=batch, p=p), rng)
        rows = rows[: budget.fit(rows)]
        if rows.shape[0] == 0:
            break
        before = budget.used
        utilities.append(budget.utilities(rows))
        drawn.append(rows)
        idle = idle + 1 if budget.used == before else 0
    if not drawn:
        return np.zeros((0, m), dtype=bool), np.zeros(0)
    return np.concatenate(drawn), np.concatenate(utilities)
