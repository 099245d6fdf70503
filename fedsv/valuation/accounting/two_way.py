"""Round levels and member effects of a run's round values, fitted together, with each round's noise.

A member's FedSV in a round it was aggregated in is modelled as V[t, i] = level_t + theta_i + e[t, i],
e's variance sigma_t^2 per round. With the rounds' precisions p_t = 1 / sigma_t^2 fixed, the weighted
least-squares fit is linear in V. It is solved through the rounds' side (a T x T system, whatever the
number of members): a member's effect given the levels is its precision-weighted mean residual,

    theta_i = sum_t g[t, i] (V[t, i] - level_t),   g[t, i] = p_t a[t, i] / c_i,   c_i = sum_t p_t a[t, i]

(a: the aggregated updates), and putting that into each round's mean leaves the levels' normal
equations S level = r, with S = diag(p n) - P A D^-1 A' P (n_t: the round's aggregated updates) and
r_t = p_t sum_i a[t, i] (V[t, i] - h_i), h_i the member's precision-weighted mean value. The effects are
centred on the members' mean (the levels take the opposite shift: level_t + theta_i is unchanged).

Why both at once: a round's mean holds the effects of the few members selected in it (10 of 100 in the
paper's studies), so residuals around it blur every effect by the luck of who else was selected, and
the spread they show counts the members' true differences as noise. The noise is estimated from the
residuals of this fit instead, robustly per round (1.4826 times the median absolute deviation of the
residuals studentized by their leverage: a round the fit weighs heavily is fitted closely), refitted
with the new precisions ITERATIONS times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

MAD_SCALE = 1.4826
"""The median absolute deviation times this is the standard deviation of normal noise."""

POOLING = 2.0
"""A round's noise variance is pooled towards the run's with this many residuals' weight."""

ITERATIONS = 6
"""Refits of the rounds' noise from the two-way residuals (the precisions settle within a few)."""


@dataclass(frozen=True)
class TwoWayFit:
    """The two-way fit's linear map for fixed precisions: `solve` gives the levels and centred effects
    of any values (..., T, N) observed where `accepted`; `noise` is each effect's variance s_i^2 about
    the members' mean (inf: a member never aggregated)."""

    accepted: BoolArray
    precision: FloatArray
    weighted: FloatArray  # each observation's weight: its round's precision
    known: BoolArray
    pull: FloatArray  # g[t, i]
    inverse: FloatArray  # S^+
    noise: FloatArray
    leverage: FloatArray  # h[t, i]: the share of an observation's noise its own fit absorbs

    @classmethod
    def build(cls, accepted: BoolArray, precision: FloatArray, ridge: float = 0.0) -> TwoWayFit:
        """The map for rounds' `precision` and a `ridge` on the effects (1 / tau^2: the mixed model)."""
        weighted = np.where(accepted, precision[:, None], 0.0)
        totals = weighted.sum(axis=0)
        known = np.asarray(totals > 0, dtype=np.bool_)
        pull = weighted / np.where(known, totals + ridge, 1.0)
        schur = np.diag(weighted.sum(axis=1)) - weighted @ pull.T
        inverse = np.asarray(np.linalg.pinv(schur, hermitian=True), dtype=np.float64)
        # the effects' covariance C = D^-1 + G' S^+ G over the known members, centred on their mean:
        # C_ii - 2 mean_j C_ij + mean C, without forming C (N x N)
        cross = inverse @ pull  # -cov(level_t, theta_i)
        own = 1.0 / np.where(known, totals + ridge, 1.0) + (pull * cross).sum(axis=0)  # C_ii
        g = pull[:, known]
        rows = (1.0 / (totals[known] + ridge) + g.T @ (inverse @ g.sum(axis=1))) / max(int(known.sum()), 1)
        noise = np.full(accepted.shape[1], math.inf)
        noise[known] = np.maximum(own[known] - 2.0 * rows + rows.mean(), 1e-300)
        # h = p_t (var level_t + var theta_i - 2 cov(level_t, theta_i)), from the same inverse
        leverage = weighted * (np.diag(inverse)[:, None] + own[None, :] - 2.0 * cross)
        leverage = np.where(accepted, np.clip(leverage, 0.0, 1.0), 0.0)
        return cls(accepted, precision, weighted, known, pull, inverse, noise, leverage)

    def solve(self, values: FloatArray) -> tuple[FloatArray, FloatArray]:
        """The levels (..., T) and the effects (..., N; 0 for a member never aggregated, mean 0 over
        the others) of round values (..., T, N)."""
        observed = np.where(self.accepted, values, 0.0)
        own = (observed * self.pull).sum(axis=-2)  # h_i
        gap = np.where(self.accepted, observed - own[..., None, :], 0.0)
        levels = (self.weighted * gap).sum(axis=-1) @ self.inverse
        effects = own - np.einsum("...t,ti->...i", levels, self.pull)
        effects = np.where(self.known, effects, 0.0)
        if self.known.any():
            mean = effects[..., self.known].mean(axis=-1, keepdims=True)
            effects = np.where(self.known, effects - mean, 0.0)
            levels = levels + mean
        return np.asarray(levels, dtype=np.float64), np.asarray(effects, dtype=np.float64)


def fit_two_way(values: FloatArray, accepted: BoolArray, freedom: int) -> TwoWayFit:
    """The two-way fit of `values` with each round's noise estimated from its residuals: first around
    the rounds' means, then, where the fit leaves `freedom` (residuals beyond a level per round and an
    effect per member) of at least 1, around levels and effects together, refitted ITERATIONS times."""
    counts = np.maximum(accepted.sum(axis=1), 1)
    means = np.where(accepted, values, 0.0).sum(axis=1) / counts
    precision = round_precision(np.where(accepted, values - means[:, None], 0.0), accepted, 1.0)
    fit = TwoWayFit.build(accepted, precision)
    if freedom < 1:
        return fit
    for _ in range(ITERATIONS):
        levels, effects = fit.solve(values)
        residual = np.where(accepted, values - levels[:, None] - effects[None, :], 0.0)
        # studentized: a round the fit weighs heavily is fitted closely, its residuals far below its noise
        studentized = np.where(accepted, residual / np.sqrt(np.maximum(1.0 - fit.leverage, 1e-12)), 0.0)
        precision = round_precision(studentized, accepted, 1.0)
        fit = TwoWayFit.build(accepted, precision)
    return fit


def round_precision(residual: FloatArray, accepted: BoolArray, inflation: float) -> FloatArray:
    """Each round's precision 1 / sigma_t^2: the spread of its residuals, taken robustly (MAD_SCALE
    times the median absolute deviation, so that a member far from the others does not pass for noise
    in the rounds it is in) times `inflation`, pooled towards the run's with POOLING residuals' weight
    (a late round, whose noise may be a tenth of an early one's, is taken noisier than it is, and an
    early one a little quieter)."""
    counts = accepted.sum(axis=1)
    freedom = np.maximum(counts - 1, 0)
    masked = np.where(accepted, np.abs(residual), np.nan)
    rows = counts > 0
    mad = np.zeros(residual.shape[0])
    if rows.any():
        mad[rows] = np.nanmedian(masked[rows], axis=1) * MAD_SCALE
    squares = freedom * np.square(mad) * inflation
    pooled = float(squares.sum() / max(int(freedom.sum()), 1))
    variance = (squares + POOLING * pooled) / (freedom + POOLING)
    return np.asarray(np.where(variance > 0, 1.0 / np.maximum(variance, 1e-300), 1.0), dtype=np.float64)
