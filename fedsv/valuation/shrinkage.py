"""The shrunk value: each member's own effect on its rounds' values, weighed by their noise, shrunk by it.

A member's FedSV in a round it was aggregated in is modelled as the round's level plus the member's own
effect plus noise, V[t, i] = level_t + theta_i + e[t, i], with e's variance sigma_t^2 per round (early
rounds, with large gains, are far noisier than late ones). The level is the round's mean observed value;
the effect is estimated from the member's residuals weighed by their precision (generalized least
squares; a round's noise taken robustly, from the median absolute deviation of its members' values),
so that one lucky early round does not outweigh five late ones:

    d_i = sum_t p_t (V[t, i] - level_t) / sum_t p_t,   p_t = 1 / sigma_t^2,   s_i^2 = 1 / sum_t p_t

over the rounds t that aggregated i's update. The members' true effects spread by tau^2 =
max(0, var(d) - mean(s^2)) (the method of moments of a normal-normal model), and each estimate is pulled
towards their mean by the share of it that is noise (empirical Bayes, James and Stein):

    shrunk_i = rate_i * sum_t w_t (level_t + mean + B_i (d_i - mean)),   B_i = tau^2 / (tau^2 + s_i^2)

w_t = m_t / N is the round's selection probability (as for the completed value: every member valued in
every round, selection luck removed) and rate_i the share of the member's selected updates that were
aggregated (a member turned away in every round is worth 0, exactly). No effect is pulled by more than
TRANSLATION of its standard errors (limited translation). tau^2 is never taken below a millionth of
the mean noise (MIN_FACTOR), so where the values cannot tell the members apart they are paid alike to a
millionth of their distance, in the order of their evidence (d_i - mean) / s_i^2, the limit of the
shrunk effects as tau^2 -> 0: what a detection by rank reads.

Why this and not the completed value shrunk: a completed total keeps every observed round value as it
came, and an early round's noise is many times a late round's; weighed by precision, the effect finds
bad data as FedSV does or better (docs/results.md), and shrunk by its own noise it moves less between
reruns (docs/valuation.md). With the levels and the factors fixed (`apply`) the
value is linear in the round values, so the validation set's and the estimator's parts of its error
follow through the same map; a rerun's part refits everything in each simulated rerun (valuation_noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

MIN_FACTOR = 1e-6
"""B never reaches 0: members the values cannot tell apart are paid alike to a millionth of their
distance, and the effects' order survives (what a detection by rank reads)."""

MIN_MEMBERS = 3
"""Fewer members with an aggregated update than this: nothing to estimate the spread from, no pull."""

MIN_FREEDOM = 2
"""Fewer residuals than this left beside a level per round and an effect per member (every member seen
once, as in a run's first round): the noise cannot be told from the members' differences, no pull."""

TRANSLATION = 2.0
"""No effect is moved further than this many of its standard errors s_i (Efron and Morris's limited
translation): a member whose data say something far beyond the noise (one that damages every round)
keeps most of it, where a normal model of the members' spread, misled by the few such members, would
pull it most of the way to the others. At 2 about 5% of members the values cannot tell apart are
released by chance (at 1, a third: on the calibration federation the twins' gap rose from 0.10 to
0.14 of a total)."""

MAD_SCALE = 1.4826
"""The median absolute deviation times this is the standard deviation of normal noise."""

POOLING = 2.0
"""A round's noise variance is pooled towards the run's with this many residuals' weight."""


@dataclass(frozen=True)
class Shrinkage:
    """The fitted pieces of the shrunk value: each round's precision p_t and weight w_t, each member's
    factor B_i and acceptance rate, which members had an update aggregated (`known`), tau^2, and the
    members whose pull the translation limit stopped, with their effects' fixed shift."""

    precision: FloatArray
    weights: FloatArray
    accepted: BoolArray
    factors: FloatArray
    rate: FloatArray
    known: BoolArray
    between: float
    limited: BoolArray
    shift: FloatArray

    @classmethod
    def fit(cls, values: FloatArray, mask: BoolArray, accepted: BoolArray, weights: FloatArray) -> Shrinkage:
        """The shrinkage of a round-by-participant matrix of values: observed where `accepted` (the
        selected updates that were aggregated), `mask` the selections, `weights` each round's w_t."""
        residual = np.where(accepted, values - _levels(values, accepted)[..., None], 0.0)
        precision = _precision(residual, accepted)
        selected = mask.sum(axis=0)
        rate = np.where(selected > 0, accepted.sum(axis=0) / np.maximum(selected, 1), 0.0)
        known = np.asarray(accepted.any(axis=0), dtype=np.bool_)
        factors, shift = np.ones(values.shape[1]), np.zeros(values.shape[1])
        limited = np.zeros(values.shape[1], dtype=np.bool_)
        between = math.nan
        # the noise is told from the members' effects only by members seen in several rounds: with
        # no residual left beside a level per round and an effect per member, nothing is pulled
        rounds = int(accepted.any(axis=1).sum())
        freedom = int(accepted.sum()) - rounds - int(known.sum()) + 1
        if known.sum() >= MIN_MEMBERS and freedom >= MIN_FREEDOM and np.square(residual).sum() > 0:
            effects, noise = _effects(residual, accepted, precision)
            mean_noise = float(noise[known].mean())
            between = max(0.0, float(np.var(effects[known], ddof=1)) - mean_noise)
            floor = max(between, MIN_FACTOR * mean_noise)
            factors[known] = floor / (floor + noise[known])
            center = float(effects[known].mean())
            pulled = center + factors * (effects - center)
            limit = TRANSLATION * np.sqrt(np.where(known, noise, 0.0))
            limited = known & (np.abs(pulled - effects) > limit)
            shift = np.where(limited, np.sign(pulled - effects) * limit, 0.0)
        weights = np.asarray(weights, dtype=np.float64)
        return cls(precision, weights, accepted, factors, rate, known, between, limited, shift)

    def apply(self, values: FloatArray, shifted: bool = True) -> FloatArray:
        """The shrunk totals (..., N) of round-by-participant values (..., T, N) with this fit's levels'
        rule, precisions, factors and translation limits: affine in `values` (linear without the
        limited members' fixed shifts, `shifted=False`: how a deviation of the values moves the totals);
        0 for a member never aggregated."""
        levels = _levels(values, self.accepted)
        residual = np.where(self.accepted, values - levels[..., None], 0.0)
        effects, _ = _effects(residual, self.accepted, self.precision)
        known = self.known
        center = effects[..., known].mean(axis=-1, keepdims=True) if known.any() else 0.0
        effect = np.where(
            self.limited,
            effects + (self.shift if shifted else 0.0),
            center + self.factors * (effects - center),
        )
        total = levels @ self.weights
        shrunk = self.rate * (np.asarray(total)[..., None] + self.weights.sum() * effect)
        return np.asarray(np.where(known, shrunk, 0.0), dtype=np.float64)

    def as_fitted(self, center: FloatArray) -> FloatArray:
        """A model of every entry (T, N) whose members spread as this fit estimates the true effects do
        (tau^2), for reruns simulated from it: each member's precision-weighted effect in `center` pulled
        towards the members' mean by sqrt(B_i) (a fitted model's effects hold their noise too, spreading
        as tau^2 + s_i^2; simulated from them, reruns would find effects more different than they are)."""
        known = self.known
        if not known.any():
            return center
        levels = center[:, known].mean(axis=1)
        weight = self.precision / self.precision.sum()
        effects = weight @ (center - levels[:, None])
        mean = float(effects[known].mean())
        kept = np.where(self.limited, 1.0, np.sqrt(self.factors))  # a limited member is far beyond its noise
        pull = np.where(known, (1.0 - kept) * (effects - mean), 0.0)
        return np.asarray(center - pull[None, :], dtype=np.float64)


def _precision(residual: FloatArray, accepted: BoolArray) -> FloatArray:
    """Each round's precision 1 / sigma_t^2: the spread of the members' values around the round's
    level, taken robustly (1.4826 times the median absolute deviation, so that a member far from the
    others does not pass for noise in the rounds it is in), pooled towards the run's with POOLING
    residuals' weight."""
    counts = accepted.sum(axis=1)
    freedom = np.maximum(counts - 1, 0)
    masked = np.where(accepted, np.abs(residual), np.nan)
    rows = counts > 0
    mad = np.zeros(residual.shape[0])
    if rows.any():
        mad[rows] = np.nanmedian(masked[rows], axis=1) * MAD_SCALE
    squares = freedom * np.square(mad)
    pooled = float(squares.sum() / max(int(freedom.sum()), 1))
    variance = (squares + POOLING * pooled) / (freedom + POOLING)
    return np.asarray(np.where(variance > 0, 1.0 / np.maximum(variance, 1e-300), 1.0), dtype=np.float64)


def _levels(values: FloatArray, accepted: BoolArray) -> FloatArray:
    """Each round's mean aggregated value (0 in a round that aggregated none)."""
    counts = np.maximum(accepted.sum(axis=-1), 1)
    return np.asarray(np.where(accepted, values, 0.0).sum(axis=-1) / counts, dtype=np.float64)


def _effects(
    residual: FloatArray, accepted: BoolArray, precision: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Each member's precision-weighted mean residual d_i and its variance s_i^2 (inf: no residual)."""
    weight = accepted * precision[:, None]
    total = weight.sum(axis=0)
    effects = (residual * weight).sum(axis=-2) / np.maximum(total, 1e-300)
    return effects, np.where(total > 0, 1.0 / np.maximum(total, 1e-300), math.inf)
