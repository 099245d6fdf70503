"""The shrunk value: completed totals pulled towards their mean by how much of their spread is noise.

Members' completed totals c_i differ by their true worth and by noise of stated variance s_i^2 (their
errors against a rerun, valuation_noise). The spread of the true worth is estimated as
tau^2 = max(0, var(c) - mean(s^2)) (the method of moments of a normal-normal model), and every total is
pulled towards the members' mean by the share of its spread that is noise:

    shrunk_i = mean + B_i (c_i - mean),   B_i = max(B, tau^2 / (tau^2 + s_i^2)),
    B = tau^2 / (tau^2 + mean(s^2))

James and Stein's estimator with one factor B for all, except that a member less noisy than the
average keeps more of its distance (its own factor), down to a value known exactly (s_i = 0: a member
turned away in every round is worth 0, in every rerun), which is not pulled at all. Where the members
cannot be told apart (tau^2 near 0) everyone else moves to the mean, and twins holding the same data
end close together; where some stand out by far more than the noise (a wrong-label member), B is near
1 and little moves. The noisier members all share B, so members on one side of the mean keep their
order against those on the other, and a detection by rank finds what the completed value finds (a
factor per member for everyone, tau^2 / (tau^2 + s_i^2), would pull the noisiest members, often the
ones with bad data, furthest towards the mean). B never reaches 0 (MIN_FACTOR), so the completed
value's order survives where the members cannot be told apart: on the paper-scale noisy-label study
tau^2 is 0, and factors of 0 tied every member (detection area 0.485, random; 0.572 with the floor,
the completed value's 0.571). The map is linear once the factors are fixed (Shrinkage.matrix), so
every part of its error follows from the completed value's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MIN_FACTOR = 1e-6
"""B never reaches 0: members the values cannot tell apart are paid alike to a millionth of their
distance, and the completed value's order survives (what a detection by rank reads)."""

MIN_MEMBERS = 3
"""Fewer members with a known error than this: nothing to estimate the spread from, no shrinkage."""


@dataclass(frozen=True)
class Shrinkage:
    """The factor B of every member with a known, non-zero error (1 for the others: a member whose value
    is exact, or whose error is unknown, is left as it is), which members are pulled (towards their own
    mean) and the estimated spread tau^2."""

    factors: FloatArray
    known: npt.NDArray[np.bool_]
    between: float

    @classmethod
    def of(cls, totals: FloatArray, errors: FloatArray) -> Shrinkage:
        known = np.isfinite(errors) & np.isfinite(totals)
        factors = np.ones(totals.shape[0])
        if known.sum() < MIN_MEMBERS:
            return cls(factors, known, math.nan)
        variance = np.square(errors[known])
        noise = float(variance.mean())
        between = max(0.0, float(np.var(totals[known], ddof=1)) - noise)
        common = between / (between + noise) if noise > 0 else 1.0
        # A member less noisy than the average keeps more of its distance (its own factor), down to a
        # value known exactly (error 0: a member turned away in every round is worth 0 in every rerun),
        # which is not pulled at all; a noisier one is pulled by the common factor, so that the noisiest
        # (often the ones with bad data) are not hidden at the mean.
        own = np.where(variance > 0, between / np.maximum(between + variance, 1e-300), 1.0)
        factors[known] = np.maximum(MIN_FACTOR, np.maximum(common, own))
        return cls(factors, known, between)

    def matrix(self) -> FloatArray:
        """M with shrunk = M @ totals: B_i on the diagonal, (1 - B_i) / K towards the K known members."""
        n = self.factors.shape[0]
        pull = np.zeros((n, n))
        weight = self.known / max(int(self.known.sum()), 1)
        pull[self.known] = np.outer(1.0 - self.factors[self.known], weight)
        return np.diag(self.factors) + pull

    def apply(self, totals: FloatArray) -> FloatArray:
        """The shrunk totals (totals: members on the first axis; NaN rows of unknown members kept)."""
        safe = np.where(self.known.reshape(-1, *([1] * (totals.ndim - 1))), totals, 0.0)
        shrunk = np.tensordot(self.matrix(), safe, axes=1)
        return np.where(self.known.reshape(-1, *([1] * (totals.ndim - 1))), shrunk, totals)
