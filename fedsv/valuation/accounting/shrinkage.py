"""The shrunk value: each member's completed total pulled towards the members the verdict cannot tell it
from, by the share of its distance from them that is noise.

A member's completed total c_i (completion.py: the expectation of its FedSV over the selection) comes
with an error s_i against the members' mean (valuation_noise.Uncertainty.between: what a rerun and a
fresh validation set would move it by, relative to the others). The verdict (verdict.py) groups the
members in value order, each group holding those that do not differ at 95%. Within a group g the true
totals are taken to spread by tau^2 around the group's precision-weighted mean m_g (weights 1 / s_i^2),
and each total is pulled towards m_g by the share of its distance that is noise (empirical Bayes):

    shrunk_i = m_g + B_i (c_i - m_g),   B_i = tau^2 / (tau^2 + s_i^2)

tau^2 is one for the run: the groups' weighted spread S about their means over the degrees of freedom
they leave, f = sum over groups of k_g - 1, less two (STEIN), less the members' mean noise; never below
a millionth of that noise (MIN_FACTOR), so members the values cannot tell apart are paid alike up to a
millionth of their distance, in the order of their evidence. With equal noise s^2 that is James and
Stein's pull, 1 - B = (f - 2) s^2 / S: of the pulls c s^2 / S, the one that minimizes Stein's unbiased
estimate of the squared error in every run (SURE: k s^2 + (c^2 - 2 c (f - 2)) s^4 / S). Plain empirical
Bayes (tau^2 at S / f, the value before) pulls f / (f - 2) times as much: less error among true equals,
more where a group's members truly differ by their noise or more, which is what the verdict's groups
hold (members up to about 2.8 standard errors of their difference apart, chained, and grouped because
they looked close, so S reads their spread low). Measured on the calibration federations, the James-
Stein pull is nearer the expected shares than the plain one on four of five (all but the main job's), by
most on the cross-silo one (docs/decisions/0005). With f <= 2 (three members pulled at most)
nobody is pulled: no pull of that form beats none there (Stein's admissibility in two dimensions).

What follows for a payout: a member alone in its group (a free rider or a member whose data damage the
model, once the verdict sets it apart) is paid its completed total, about 0 for a member worth nothing;
members the verdict cannot tell apart (twins, equals) are pulled together; groups keep their order
(every total of a group lies between its completed total and its group's mean, and groups are
contiguous in value order). Once fitted (groups, B_i) the value is linear in the completed totals, so
the estimator's and the validation set's parts of its error follow through the same map; a rerun's
part refits it in every simulated rerun, with that rerun's own groups (valuation_noise, rerun_noise).

Why the completed totals and not a fit of the round values: the reference a payout is judged by is a
member's expected FedSV over the selection, the completed value's expectation; a two-way fit of the
round values weighed by precision (the value before) read the late rounds' effects and missed members
whose worth shows in the first rounds (docs/valuation.md, "Paying for data").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import chi2

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

CONFIDENCE: float | None = None
"""None: the pull at James and Stein's estimate (STEIN); a number: tau^2 at the lower bound of that
one-sided confidence for the groups' spread (chi-square). The 75%, 90% and 99% bounds, tau^2 at its
estimate and the James-Stein pull were measured on the calibration federations (docs/decisions/0005)."""

STEIN = 2
"""Degrees of freedom the pull's estimate spends beyond the groups' means (James-Stein: k - 3 for k
members pulled towards their estimated mean is k - 1 - 2)."""

MIN_FACTOR = 1e-6
"""B never reaches 0: members the values cannot tell apart are paid alike to a millionth of their
distance, and the order of their evidence survives (what a detection by rank reads)."""


@dataclass(frozen=True)
class Shrinkage:
    """The fitted pull within one grouping (a Fits of one row): the groups pulled together (column
    indices; members with a known total and a positive, finite error, two or more to a group), each
    member's factor B_i (1: not pulled), each member's weight in its group's mean, and tau^2 (NaN: no
    group, or too few members to estimate it from)."""

    fitted: Fits

    @classmethod
    def fit(
        cls,
        totals: FloatArray,
        errors: FloatArray,
        groups: Sequence[Sequence[int]] | None,
        aggregated: BoolArray | None = None,
    ) -> Shrinkage:
        """The pull of completed totals (N,) with errors against the members' mean (N,; NaN or inf:
        unknown, 0: neither pulled nor pulling) within `groups` (the verdict's; None: nothing can be
        told, nobody pulled); `aggregated`: the members with an aggregated update (None: all). A member
        turned away in every round is worth 0, exactly: neither pulled nor pulling."""
        return cls(Fits.of(totals, errors, [groups], aggregated))

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        labels = self.fitted.labels[0]
        return tuple(
            tuple(int(i) for i in np.flatnonzero(labels == g)) for g in np.unique(labels[labels >= 0])
        )

    @property
    def factors(self) -> FloatArray:
        return self.fitted.factors[0]

    @property
    def weights(self) -> FloatArray:
        return self.fitted.weights[0]

    @property
    def between(self) -> float:
        return float(self.fitted.between[0])

    def map(self, power: float = 1.0) -> FloatArray:
        """The (N, N) linear map from completed totals to shrunk ones, m_g + B_i^power (c_i - m_g) for a
        pulled member and c_i for the others."""
        return self.fitted.maps(power)

    def apply(self, totals: FloatArray) -> FloatArray:
        """The shrunk totals of completed totals (..., N) with this fit's groups and factors."""
        return np.asarray(np.einsum("ij,...j->...i", self.map(), totals), dtype=np.float64)

    def as_fitted(self, totals: FloatArray) -> FloatArray:
        """Totals (..., N) whose members spread within their groups as this fit estimates the true totals
        do (tau^2), for reruns simulated from them: each pulled towards its group's mean by sqrt(B_i). A
        run's totals hold their noise too, spreading as tau^2 + s_i^2; simulated from them, reruns would
        find the members more different than they are, and pull them less than real reruns do."""
        return np.asarray(np.einsum("ij,...j->...i", self.map(0.5), totals), dtype=np.float64)


@dataclass(frozen=True)
class Fits:
    """The pull fitted within each of D groupings at once, of the same totals or each of its own (the
    averaged pull's draws: thousands per uncertainty): per grouping, each member's group (labels, -1:
    not pulled), factor B_i (1: not pulled), weight in its group's mean, and tau^2 (NaN: nobody pulled)."""

    labels: npt.NDArray[np.int64]
    factors: FloatArray
    weights: FloatArray
    between: FloatArray

    @classmethod
    def of(
        cls,
        totals: FloatArray,
        errors: FloatArray,
        groupings: Sequence[Sequence[Sequence[int]] | None] | npt.NDArray[np.int64],
        aggregated: BoolArray | None = None,
    ) -> Fits:
        """Shrinkage.fit's pull (see there) within each grouping of `groupings` (None: nobody pulled),
        or of each row of a (D, N) array of group labels (verdict.Labels.by_column; -1: no group), of
        `totals` (N,), or of each grouping's own totals (D, N)."""
        noise = np.square(np.asarray(errors, dtype=np.float64))
        draws, n = len(groupings), noise.shape[0]
        table = np.broadcast_to(np.asarray(totals, dtype=np.float64), (draws, n))
        usable = np.isfinite(table) & (np.isfinite(noise) & (noise > 0))[None, :]
        if aggregated is not None:
            usable = usable & aggregated[None, :]
        if isinstance(groupings, np.ndarray):
            labels = np.asarray(groupings, dtype=np.int64)
        else:
            labels = np.full((draws, n), -1)
            for d, groups in enumerate(groupings):
                for g, group in enumerate(groups or []):
                    labels[d, list(group)] = g
        labels = np.where(usable, labels, -1)
        # a group with fewer than two usable members is not pulled
        bucket = np.where(labels >= 0, labels + n * np.arange(draws)[:, None], draws * n)
        size = np.bincount(bucket.ravel(), minlength=draws * n + 1)
        labels = np.where((labels >= 0) & (size[bucket] >= 2), labels, -1)
        pulled = labels >= 0
        bucket = np.where(pulled, bucket, draws * n)
        precision = np.where(pulled, 1.0 / np.where(usable, noise, 1.0), 0.0)
        total = _summed(bucket, precision, draws * n)[bucket]
        weights = np.divide(precision, total, out=np.zeros_like(precision), where=pulled)
        means = _summed(bucket, weights * np.nan_to_num(table), draws * n)[bucket]
        squares = np.where(pulled, np.square(np.nan_to_num(table) - means), 0.0).sum(axis=1)
        members = pulled.sum(axis=1)
        groups = (size[:-1].reshape(draws, n) >= 2).sum(axis=1)  # the pulled groups: two or more each
        freedom = members - groups
        mean_noise = np.where(pulled, np.nan_to_num(noise), 0.0).sum(axis=1) / np.maximum(members, 1)
        quantile = (
            (freedom - STEIN).astype(np.float64) if CONFIDENCE is None else chi2.ppf(CONFIDENCE, freedom)
        )
        fitted = (members > 0) & (quantile > 0)  # too few to estimate the pull from: nobody is pulled
        between = np.maximum(squares / np.where(fitted, quantile, 1.0) - mean_noise, MIN_FACTOR * mean_noise)
        between = np.where(fitted, between, np.nan)
        labels = np.where(fitted[:, None], labels, -1)
        factors = np.where(labels >= 0, between[:, None] / (between[:, None] + np.nan_to_num(noise)), 1.0)
        return cls(labels, factors, np.where(labels >= 0, weights, 0.0), between)

    def maps(self, power: float = 1.0) -> FloatArray:
        """The average over the groupings of Shrinkage.map(power): (N, N)."""
        kept = np.power(self.factors, power)
        same = (self.labels[:, :, None] == self.labels[:, None, :]) & (self.labels[:, :, None] >= 0)
        means = np.where(same, self.weights[:, None, :], 0.0)
        each = (1.0 - kept)[:, :, None] * means
        each[:, np.arange(kept.shape[1]), np.arange(kept.shape[1])] += kept
        return np.asarray(each.mean(axis=0), dtype=np.float64)

    def applied(self, totals: FloatArray, power: float = 1.0) -> FloatArray:
        """Each grouping's map(power) applied to `totals` (N,) or to its own row of them (D, N): (D, N)."""
        draws, n = self.labels.shape
        table = np.broadcast_to(np.asarray(totals, dtype=np.float64), (draws, n))
        kept = np.power(self.factors, power)
        bucket = np.where(self.labels >= 0, self.labels + n * np.arange(draws)[:, None], draws * n)
        means = _summed(bucket, self.weights * np.nan_to_num(table), draws * n)[bucket]
        return np.asarray(
            kept * table + (1.0 - kept) * np.where(self.labels >= 0, means, 0.0), dtype=np.float64
        )


def _summed(bucket: npt.NDArray[np.int64], values: FloatArray, dump: int) -> FloatArray:
    """The sum of `values` over each bucket (bucket `dump`, the last, holds what is not pulled)."""
    summed = np.bincount(bucket.ravel(), weights=values.ravel(), minlength=dump + 1)
    return np.asarray(summed, dtype=np.float64)
