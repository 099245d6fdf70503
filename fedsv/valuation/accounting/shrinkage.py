"""The shrunk value: each member's own effect on its rounds' values, fitted with their levels, shrunk
towards the members the verdict cannot tell it from.

A member's FedSV in a round it was aggregated in is modelled as the round's level plus the member's own
effect plus noise, V[t, i] = level_t + theta_i + e[t, i], with e's variance sigma_t^2 per round (early
rounds, with large gains, are far noisier than late ones). Levels and effects are fitted together
(two_way.py: a round's mean holds the effects of the few members selected in it, and residuals around
it blur each effect by who else was selected), each round weighed by its precision p_t = 1 / sigma_t^2,
so that one lucky early round does not outweigh five late ones; each effect's noise s_i^2 comes with
the fit. The members' true effects are taken to spread by tau^2, and the effects are the mixed model's
(Henderson's equations: the same fit with a ridge 1 / tau^2 on the effects), each pulled towards the
members' mean by about the share of it that is noise, B_i = tau^2 / (tau^2 + s_i^2) (empirical Bayes):

    shrunk_i = rate_i * sum_t w_t (level_t + theta_i)   (levels and effects of the mixed model)

w_t = m_t / N is the round's selection probability (as for the completed value: every member valued in
every round, selection luck removed) and rate_i the share of the member's selected updates that were
aggregated (a member turned away in every round is worth 0, exactly).

tau^2 is taken at the lower CONFIDENCE bound of the effects' spread within the groups (chi-square,
beyond their mean noise), not at its estimate: a payout rewards a member's distance from the others in
full only where the run shows, beyond reasonable doubt, that the members differ. No effect is pulled by
more than TRANSLATION of its standard errors from the two-way fit's (limited translation). tau^2 is
never taken below a millionth of the mean noise (MIN_FACTOR), so where the values cannot tell the members
apart they are paid alike to a millionth of their distance, in the order of their evidence
sum_t p_t r[t, i], the limit of the shrunk effects as tau^2 -> 0: what a detection by rank reads.

Why this and not the completed value shrunk: a completed total keeps every observed round value as it
came, and an early round's noise is many times a late round's; fitted with the levels and weighed by
precision, the effect finds bad data as FedSV does in the paper-scale MLP studies (less well in the
CNN studies: docs/results.md), and shrunk by its own noise it moves less between reruns on three of
the four calibration federations (docs/valuation.md). With the fit fixed (`apply`) the value is linear
in the round values, so the validation set's and the estimator's parts of its error follow through the
same map; a rerun's part refits everything in each simulated rerun (valuation_noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import chi2

from fedsv.valuation.accounting.two_way import TwoWayFit, fit_two_way

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

CONFIDENCE = 0.99
"""tau^2 is the lower bound of this one-sided confidence for the effects' spread: on the calibration
federation (docs/valuation.md) the twins' gap is 0.18 of a total at the point estimate, 0.15 at the
95% bound and 0.135 at 99%; the detection areas of docs/results.md do not move with it (within 0.005)."""

MIN_FACTOR = 1e-6
"""B never reaches 0: members the values cannot tell apart are paid alike to a millionth of their
distance, and the effects' order survives (what a detection by rank reads)."""

MIN_MEMBERS = 3
"""Fewer members with an aggregated update than this: nothing to estimate the spread from, no pull."""

MIN_FREEDOM = 2
"""Fewer residuals than this left beside a level per round and an effect per member (every member seen
once, as in a run's first round): the noise cannot be told from the members' differences, no pull."""

TRANSLATION = 3.0
"""No effect is moved further than this many of its standard errors s_i (Efron and Morris's limited
translation): a member whose data say something far beyond the noise (one that damages every round)
keeps most of it, where a normal model of the members' spread, misled by the few such members, would
pull it most of the way to the others. At 3 about 0.3% of members the values cannot tell apart are
released by chance (at 2, 5%)."""


@dataclass(frozen=True)
class Shrinkage:
    """The fitted pieces of the shrunk value: the two-way fit (each round's precision p_t, each
    member's noise s_i^2) and its mixed-model form (None: nothing pulled), each round's weight w_t,
    each member's factor B_i and acceptance rate, tau^2, and the members whose pull the translation
    limit stopped, with their effects' fixed shift."""

    two_way: TwoWayFit
    mixed: TwoWayFit | None
    weights: FloatArray
    factors: FloatArray
    rate: FloatArray
    between: float
    limited: BoolArray
    shift: FloatArray
    centering: FloatArray | None = None  # (N, N): each member's group mean of the effects (None: one group)

    @property
    def precision(self) -> FloatArray:
        return self.two_way.precision

    @property
    def known(self) -> BoolArray:
        """The members with an aggregated update."""
        return self.two_way.known

    @property
    def noise(self) -> FloatArray:
        return self.two_way.noise

    def alone(self, groups: Sequence[Sequence[int]] | None) -> BoolArray:
        """The members in a group of their own (of `groups`; None: one group) with an aggregated update:
        nobody to be pulled towards, so their shrunk value is their completed one."""
        out = np.zeros(self.known.shape[0], dtype=np.bool_)
        for group in groups or []:
            out[group] = len(group) == 1 and bool(self.known[group[0]])
        return out

    @classmethod
    def fit(
        cls,
        values: FloatArray,
        mask: BoolArray,
        accepted: BoolArray,
        weights: FloatArray,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> Shrinkage:
        """The shrinkage of a round-by-participant matrix of values: observed where `accepted` (the
        selected updates that were aggregated), `mask` the selections, `weights` each round's w_t;
        `groups`: the members (column indices) each effect is pulled towards (None or one group of
        all: the members' mean)."""
        known = np.asarray(accepted.any(axis=0), dtype=np.bool_)
        # the noise is told from the members' effects only by members seen in several rounds: with
        # no residual left beside a level per round and an effect per member, nothing is pulled
        rounds = int(accepted.any(axis=1).sum())
        freedom = int(accepted.sum()) - rounds - int(known.sum()) + 1
        two_way = fit_two_way(values, accepted, freedom)
        selected = mask.sum(axis=0)
        rate = np.where(selected > 0, accepted.sum(axis=0) / np.maximum(selected, 1), 0.0)
        factors, shift = np.ones(values.shape[1]), np.zeros(values.shape[1])
        limited = np.zeros(values.shape[1], dtype=np.bool_)
        between, mixed = math.nan, None
        centering = _centering(groups, known, two_way.noise)
        if known.sum() >= MIN_MEMBERS and freedom >= MIN_FREEDOM:
            _, effects = two_way.solve(values)
            noise = two_way.noise[known]
            mean_noise = float(noise.mean())
            # each effect less its group's mean (the two-way fit's effects are centred on all members')
            own = effects if centering is None else effects - centering @ effects
            between = spread_bound(own[known], mean_noise, _freedom(groups, known))
            floor = max(between, MIN_FACTOR * mean_noise)
            factors[known] = floor / (floor + noise)
            mixed = TwoWayFit.build(accepted, two_way.precision, ridge=1.0 / floor)
            _, pulled = _pulled(mixed, values, two_way, centering)
            limit = TRANSLATION * np.sqrt(np.where(known, two_way.noise, 0.0))
            limited = known & (np.abs(pulled - effects) > limit)
            shift = np.where(limited, np.sign(pulled - effects) * limit, 0.0)
        weights = np.asarray(weights, dtype=np.float64)
        return cls(two_way, mixed, weights, factors, rate, between, limited, shift, centering)

    def apply(self, values: FloatArray, shifted: bool = True) -> FloatArray:
        """The shrunk totals (..., N) of round-by-participant values (..., T, N) with this fit's
        precisions, tau^2 and translation limits: affine in `values` (linear without the limited
        members' fixed shifts, `shifted=False`: how a deviation of the values moves the totals);
        0 for a member never aggregated."""
        if self.mixed is None:
            levels, effect = self.two_way.solve(values)
        else:
            levels, effect = _pulled(self.mixed, values, self.two_way, self.centering)
        if self.limited.any():
            _, effects = self.two_way.solve(values)
            effect = np.where(self.limited, effects + (self.shift if shifted else 0.0), effect)
        total = levels @ self.weights
        shrunk = self.rate * (np.asarray(total)[..., None] + self.weights.sum() * effect)
        return np.asarray(np.where(self.known, shrunk, 0.0), dtype=np.float64)

    def as_fitted(self, center: FloatArray) -> FloatArray:
        """A model of every entry (T, N) whose members spread as this fit estimates the true effects do
        (tau^2), for reruns simulated from it: each member's precision-weighted effect in `center` pulled
        towards its group's mean by sqrt(B_i) (a fitted model's effects hold their noise too, spreading
        as tau^2 + s_i^2; simulated from them, reruns would find effects more different than they are)."""
        known = self.known
        if not known.any():
            return center
        levels = center[:, known].mean(axis=1)
        weight = self.precision / self.precision.sum()
        effects = weight @ (center - levels[:, None])
        mean = float(effects[known].mean()) if self.centering is None else self.centering @ effects
        kept = np.where(self.limited, 1.0, np.sqrt(self.factors))  # a limited member is far beyond its noise
        pull = np.where(known, (1.0 - kept) * (effects - mean), 0.0)
        return np.asarray(center - pull[None, :], dtype=np.float64)


def spread_bound(deviations: FloatArray, mean_noise: float, freedom: int) -> float:
    """tau^2 at its lower CONFIDENCE bound: sum(d^2) / chi2_CONFIDENCE(f) less the mean noise, d each
    effect less its group's mean and f the degrees of freedom they leave (k - 1 for one group of k:
    sum(d^2) / (tau^2 + s^2) is chi-square with f degrees of freedom for normal effects of equal noise
    s^2); never below 0, and 0 where no group has two members."""
    if freedom < 1:
        return 0.0
    bound = float(np.sum(np.square(deviations))) / float(chi2.ppf(CONFIDENCE, freedom))
    return max(0.0, bound - mean_noise)


def _centering(
    groups: Sequence[Sequence[int]] | None, known: BoolArray, noise: FloatArray
) -> FloatArray | None:
    """The (N, N) map from the effects to each member's group mean of them (precision-weighted by 1 / s_i^2,
    over the group's members with an aggregated update); None for no groups or one group of all."""
    members = [[i for i in group if known[i]] for group in groups or []]
    members = [group for group in members if group]
    if len(members) <= 1:  # the groups cover every member (the verdict's do): one group is everyone
        return None
    out = np.zeros((known.shape[0], known.shape[0]))
    for group in members:
        weight = 1.0 / noise[group]
        out[np.ix_(group, group)] = weight / weight.sum()
    return out


def _freedom(groups: Sequence[Sequence[int]] | None, known: BoolArray) -> int:
    """The degrees of freedom the effects leave about their group means (k - 1 with no groups)."""
    if groups is None:
        return int(known.sum()) - 1
    sizes = [sum(1 for i in group if known[i]) for group in groups]
    return sum(max(size - 1, 0) for size in sizes)


def _pulled(
    mixed: TwoWayFit, values: FloatArray, two_way: TwoWayFit, centering: FloatArray | None
) -> tuple[FloatArray, FloatArray]:
    """The mixed model's levels and effects, the effects pulled towards each member's group mean: the
    mixed model fitted to the values less each member's group mean of the unpulled effects, which is
    then added back, and the effects centred on the members' mean again (the levels take the opposite
    shift). With one group, the mixed model's own fit."""
    if centering is None:
        return mixed.solve(values)
    _, effects = two_way.solve(values)
    centers = np.einsum("ij,...j->...i", centering, effects)
    levels, pulled = mixed.solve(values - np.where(mixed.accepted, centers[..., None, :], 0.0))
    pulled = np.where(mixed.known, pulled + centers, 0.0)
    mean = pulled[..., mixed.known].mean(axis=-1, keepdims=True)
    return np.asarray(levels + mean, dtype=np.float64), np.asarray(
        np.where(mixed.known, pulled - mean, 0.0), dtype=np.float64
    )
