"""Paired KernelSHAP and Leverage SHAP: Shapley values as a constrained, kernel-weighted least-squares fit."""

from __future__ import annotations

import logging
from functools import lru_cache
from math import comb

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.border import Border, interior_sizes
from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.estimators.estimator import Outcome, StratifiedEstimator
from fedsv.valuation.games.game import BoolMatrix, FloatArray

logger = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
Rows = tuple[BoolMatrix, FloatArray]
Estimate = tuple[FloatArray, FloatArray]
Sample = tuple[BoolMatrix, FloatArray, int]
"""Evaluated pairs (S, complement) on consecutive rows, their utilities, and the number of pairs drawn."""

JACKKNIFE_GROUPS = 10
"""Disjoint groups of sampled pairs behind the delete-a-group jackknife standard error."""

_DRAWS_PER_EVALUATION = 8
"""KernelSHAP draws at most this many pairs per unit of budget (it would never stop on a game whose
interior coalitions are all cached); Leverage SHAP refills the budget at most _ROUNDS times."""
_ROUNDS, _MIN_CHUNK = 16, 256
_RANK_LIMIT = 2**62
"""Strata of fewer coalitions than this are drawn by rank (int64); larger ones by random keys."""


def total_kernel_weights(m: int) -> FloatArray:
    """T[s] = (m-1)/(s(m-s)): the Shapley kernel's weight summed over the C(m, s) coalitions of size s
    (0 < s < m); T[0] = T[m] = 0, since U(empty) and U(all) enter through the efficiency constraint."""
    s = np.arange(1, m, dtype=np.float64)
    return np.concatenate([[0.0], (m - 1) / (s * (m - s)), [0.0]])


@lru_cache(maxsize=8)
def _binomials(n: int) -> IntArray:
    """C(a, b) for a, b <= n, clipped at _RANK_LIMIT (unranking a rank below the limit never reads more)."""
    return np.array([[min(comb(a, b), _RANK_LIMIT) for b in range(n + 1)] for a in range(n + 1)], np.int64)


def unrank(m: int, sizes: IntArray, ranks: IntArray) -> BoolMatrix:
    """Row k: the ranks[k]-th coalition of sizes[k] players among m, lexicographically (C(m, s) < 2^62)."""
    rows = np.zeros((sizes.shape[0], m), dtype=bool)
    left, rank = sizes.astype(np.int64), ranks.astype(np.int64)
    for i in range(m):
        with_i = np.where(left > 0, _binomials(m)[m - i - 1][np.maximum(left - 1, 0)], 0)
        take = (left > 0) & (rank < with_i)
        rows[:, i] = take
        rank = np.where(take, rank, rank - with_i)
        left = left - take
    return rows


def random_coalitions(rng: np.random.Generator, m: int, sizes: IntArray) -> BoolMatrix:
    """One coalition per entry of `sizes`, uniform among the coalitions of that size (with replacement)."""
    counts = _binomials(m)[m][sizes]
    if not np.any(counts >= _RANK_LIMIT):
        return unrank(m, sizes, rng.integers(0, counts))
    order = np.argsort(np.argsort(rng.random((sizes.shape[0], m)), axis=1), axis=1)
    return np.asarray(order < sizes[:, None], dtype=bool)


def allocate(rng: np.random.Generator, rates: FloatArray, room: FloatArray, n: int) -> IntArray:
    """n items over strata in proportion to `rates`, none beyond a stratum's `room` (water-filling),
    rounded to integers at random with the fractional parts as weights."""
    if room.sum() <= n:
        return room.astype(np.int64)
    target, active, left = np.zeros_like(rates), room > 0, float(n)
    while True:
        level = left / rates[active].sum()
        full = active & (level * rates >= room)
        if not full.any():
            break
        target[full], left, active = room[full], left - room[full].sum(), active & ~full
    target[active] = level * rates[active]
    counts = np.floor(target)
    frac = target - counts
    extra = min(round(n - counts.sum()), int(np.count_nonzero(frac)))
    if extra > 0:
        counts[rng.choice(len(rates), size=extra, replace=False, p=frac / frac.sum())] += 1
    return counts.astype(np.int64)


def paired(rows: BoolMatrix) -> BoolMatrix:
    """Each row followed by its complement: (2n, m)."""
    return np.stack([rows, ~rows], axis=1).reshape(-1, rows.shape[1])


def distinct_pairs(rows: BoolMatrix, utilities: FloatArray) -> tuple[BoolMatrix, FloatArray]:
    """The first occurrence of each pair (S, complement) among consecutive row pairs, in draw order."""
    canonical = np.where(rows[0::2, :1], rows[0::2], rows[1::2])  # the side that holds player 0
    _, first = np.unique(np.packbits(canonical, axis=1), axis=0, return_index=True)
    keep = (2 * np.sort(first)[:, None] + np.arange(2)).reshape(-1)
    return rows[keep], utilities[keep]


def _solve(gram: FloatArray, moment: FloatArray, gain: float) -> FloatArray:
    """argmin phi'A phi - 2 phi'b subject to sum(phi) = gain (b taken against U - U(empty) - |S| gain/m):
    phi = gain/m + x, x the least-squares solution of P A P x = P b on the plane sum(x) = 0."""
    m = gram.shape[0]
    centred = gram - gram.mean(axis=0) - gram.mean(axis=1)[:, None] + gram.mean()
    a = centred + (np.trace(gram) / m + 1.0) / m  # plus a multiple of 11'/m: the 1-direction non-singular
    x = np.linalg.lstsq(a, moment - moment.mean(), rcond=None)[0]
    return np.asarray(x - x.mean() + gain / m, dtype=np.float64)


def _gram(z: FloatArray, w: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """sum_k w_k z_k z_k' and sum_k w_k y_k z_k (einsum: a threaded BLAS is slow on many thin products)."""
    zw = z * w[:, None]
    return np.einsum("ki,kj->ij", zw, z), np.einsum("ki,k->i", zw, y)


def regression(fixed: Rows, sampled: Rows, groups: IntArray, totals: FloatArray, gain: float) -> Estimate:
    """Values from `fixed` rows (each at its kernel weight) and `sampled` rows, whose n_s rows of size s
    share totals[s] (pro rata over the sizes sampled at all), utilities relative to U(empty), summing to
    `gain`; and their delete-a-group jackknife standard error over `groups`."""
    m = totals.shape[0] - 1
    z_fixed, s_fixed = fixed[0].astype(np.float64), fixed[0].sum(axis=1)
    kernel = np.divide(total_kernel_weights(m), [float(comb(m, s)) for s in range(m + 1)])
    gram, moment = _gram(z_fixed, kernel[s_fixed], fixed[1] - s_fixed * gain / m)
    z, s = sampled[0].astype(np.float64), sampled[0].sum(axis=1)
    y = sampled[1] - s * gain / m
    by_size = np.zeros((m + 1, m, m)), np.zeros((m + 1, m))
    for t in np.unique(s):
        by_size[0][t], by_size[1][t] = _gram(z[s == t], np.ones(int(np.sum(s == t))), y[s == t])
    counts = np.bincount(s, minlength=m + 1).astype(np.float64)

    def weights(counts: FloatArray) -> FloatArray:
        have = (counts > 0) & (totals > 0)
        scale = totals.sum() / totals[have].sum() if have.any() else 0.0
        return np.asarray(np.where(have, totals * scale / np.maximum(counts, 1), 0.0), dtype=np.float64)

    def fit(c: FloatArray, out: tuple[FloatArray, FloatArray]) -> FloatArray:
        return _solve(gram + np.tensordot(c, by_size[0], 1) - out[0], moment + c @ by_size[1] - out[1], gain)

    values = fit(weights(counts), (np.zeros((m, m)), np.zeros(m)))
    k = int(groups.max()) + 1 if groups.size else 0
    if k < 2:  # no spread to measure: exact if nothing is sampled, else unknown
        return values, np.full(m, np.nan if totals.any() else 0.0)
    leave_out = np.empty((k, m))
    for j in range(k):
        pick = groups == j
        cj = weights(counts - np.bincount(s[pick], minlength=m + 1))
        leave_out[j] = fit(cj, _gram(z[pick], cj[s[pick]], y[pick]))
    spread = ((leave_out - leave_out.mean(axis=0)) ** 2).sum(axis=0)
    return values, np.sqrt((k - 1) / k * spread)


def _pair_count(m: int, j: int) -> int:
    """Pairs (S, complement) whose smaller side has j players."""
    return comb(m, j) if 2 * j < m else comb(m, j) // 2


class _PairedRegression(StratifiedEstimator):
    """Border strata exactly, interior strata sampled in pairs, one constrained weighted least squares.

    Every coalition of an exactly evaluated size s weighs its Shapley kernel weight
    (m-1)/(C(m,s) s (m-s)). Repeated draws are merged: given their number n_s, the distinct sampled
    coalitions of an interior size s are a uniform subset of that size, and share the stratum's total
    kernel weight T(s) = (m-1)/(s(m-s)) equally (a stratum left without samples gives its weight to
    the sampled ones pro rata; one drawn in full is exact). Standard errors: delete-a-group jackknife
    over JACKKNIFE_GROUPS disjoint groups of sampled pairs (dealt round robin stratum by stratum), the
    exact strata held fixed, times the finite-population correction sqrt(1 - sampled share). The fit
    is efficient by construction (the constraint), so the base class's efficiency shift is no shift.
    """

    def _sample(self, ev: EvaluationBudget, rng: np.random.Generator, interior: list[int]) -> Sample:
        raise NotImplementedError

    def from_border(self, budget: EvaluationBudget, border: Border) -> Outcome:
        m = budget.game.m
        empty, grand = border.empty, border.grand
        interior = interior_sizes(m, border.sizes)
        rows, utilities, draws = self._sample(budget, self.rng(), interior)
        rows, utilities = distinct_pairs(rows, utilities)
        size = rows.sum(axis=1)
        small = np.minimum(size, m - size)[0::2]
        found = np.bincount(small, minlength=m + 1)
        exact = [j for j in interior if 2 * j <= m and found[j] == _pair_count(m, j)]
        sampled = [j for j in interior if 2 * j <= m and j not in exact]
        fraction = sum(int(found[j]) for j in sampled) / max(1, sum(_pair_count(m, j) for j in sampled))
        fixed = np.isin(size, exact + [m - j for j in exact])
        drawn = small[~fixed[0::2]]
        k = max(1, min(JACKKNIFE_GROUPS, drawn.shape[0]))
        groups = np.zeros(drawn.shape[0], dtype=np.int64)
        groups[np.argsort(drawn, kind="stable")] = np.arange(drawn.shape[0]) % k
        totals = total_kernel_weights(m)
        totals[[t for t in range(m + 1) if min(t, m - t) not in sampled]] = 0.0
        known = (
            np.concatenate([border.rows, rows[fixed]]),
            np.concatenate([border.utilities, utilities[fixed]]) - empty,
        )
        guess = (rows[~fixed], utilities[~fixed] - empty)
        values, stderr = regression(known, guess, np.repeat(groups, 2), totals, grand - empty)
        logger.debug("%s: %d distinct sampled pairs of %d players", self.method, rows.shape[0] // 2, m)
        exact_sizes, used = sorted({*exact, *(m - j for j in exact)}), k if drawn.shape[0] >= 2 else 0
        extra = {"exact_sizes": exact_sizes, "jackknife_groups": used, "draws": 2 * draws}
        return Outcome(values, stderr * np.sqrt(1.0 - fraction), samples=int(rows.shape[0]), extra=extra)


class KernelSHAP(_PairedRegression):
    """Paired KernelSHAP (Lundberg & Lee 2017; Covert & Lee 2021) on the border strata plus samples.

    Interior sizes are drawn with p(s) proportional to T(s), a coalition of that size uniformly, each
    paired with its complement, with replacement; pairs are drawn until the next one would overrun the
    budget of new distinct coalitions (cached coalitions cost nothing).
    """

    method = "kernelshap"

    def _sample(self, ev: EvaluationBudget, rng: np.random.Generator, interior: list[int]) -> Sample:
        m = ev.game.m
        sizes = np.asarray(interior, dtype=np.int64)
        p = total_kernel_weights(m)[sizes]
        chunks, values = [np.zeros((0, m), dtype=bool)], [np.zeros(0)]
        drawn, cap = 0, _DRAWS_PER_EVALUATION * self.budget if interior else 0
        while drawn < cap:
            want = min(cap - drawn, max(_MIN_CHUNK, ev.remaining // 2 + 1))
            rows = paired(random_coalitions(rng, m, rng.choice(sizes, size=want, p=p / p.sum())))
            fit = ev.fit_groups(rows, 2)
            chunks.append(rows[: 2 * fit])
            values.append(ev.utilities(chunks[-1]))
            drawn += fit
            if fit < want:
                break
        return np.concatenate(chunks), np.concatenate(values), drawn


class LeverageSHAP(_PairedRegression):
    """Leverage SHAP (Musco & Witter 2025): paired KernelSHAP sampled by leverage scores, without replacement.

    The leverage score of a coalition is proportional to 1/C(m, |S|), so every interior size gets the
    same expected number of coalitions (water-filled where a stratum is smaller than its share); pairs
    (S, complement) are drawn uniformly without replacement within their stratum and reweighted by
    kernel weight / inclusion probability, i.e. T(s)/n_s.
    """

    method = "leverage"

    def _sample(self, ev: EvaluationBudget, rng: np.random.Generator, interior: list[int]) -> Sample:
        m, most = ev.game.m, self.budget // 2
        strata = [j for j in interior if 2 * j <= m]  # a pair's smaller side; j = m/2 pairs lie in one size
        rates = np.array([2.0 if 2 * j < m else 1.0 for j in strata])
        total = [_pair_count(m, j) for j in strata]
        # each stratum's pairs in random order (ranks), as many as the budget could ever take
        queue = [rng.choice(n, size=min(n, most), replace=False) if n < _RANK_LIMIT else None for n in total]
        used = np.zeros(len(strata), dtype=np.int64)
        chunks, values = [np.zeros((0, m), dtype=bool)], [np.zeros(0)]
        for _ in range(_ROUNDS if strata else 0):
            room = (np.minimum(np.array(total, dtype=np.float64), most) - used).astype(np.float64)
            if ev.remaining < 2 or room.sum() == 0:
                break
            counts = allocate(rng, rates, room, ev.remaining // 2)
            picks = [
                self._pairs(rng, m, j, c, None if q is None else q[u : u + c])
                for j, c, q, u in zip(strata, counts, queue, used, strict=True)
            ]
            order = rng.permutation(int(counts.sum()))
            both = paired(np.concatenate(picks)[order])
            fit = ev.fit_groups(both, 2)
            chunks.append(both[: 2 * fit])
            values.append(ev.utilities(chunks[-1]))
            used += counts
            if fit < order.shape[0]:  # the budget is spent: the pairs left over are never used
                break
        rows = np.concatenate(chunks)
        return rows, np.concatenate(values), rows.shape[0] // 2

    @staticmethod
    def _pairs(rng: np.random.Generator, m: int, j: int, count: int, ranks: IntArray | None) -> BoolMatrix:
        """`count` pairs of stratum j, by rank: their smaller sides (the sides with player 0 if j = m/2)."""
        if ranks is None:  # astronomically many pairs: drawn with replacement, a repeat is improbable
            return random_coalitions(rng, m, np.full(count, j))
        if 2 * j < m:
            return unrank(m, np.full(count, j), ranks)
        half = unrank(m - 1, np.full(count, j - 1), ranks)
        return np.concatenate([np.ones((count, 1), dtype=bool), half], axis=1)
