"""The shrunk value: completed totals pulled towards their mean by how much of their spread is noise.

Members' completed totals c_i differ by their true worth and by noise of stated variance s_i^2 (their
errors against a rerun, valuation_noise). The spread of the true worth is estimated as
tau^2 = max(0, var(c) - mean(s^2)) (the method of moments of a normal-normal model), and each total is
pulled towards the members' mean by its own noise:

    shrunk_i = mean + B_i (c_i - mean),   B_i = tau^2 / (tau^2 + s_i^2)

(empirical Bayes; James and Stein's estimator when every s_i is equal). Where the members cannot be
told apart (tau^2 near 0) everyone moves to the mean, and twins holding the same data end close
together; a member whose worth stands out by far more than its noise (a wrong-label member) keeps
nearly all of its distance. With equal errors the order of the members is unchanged, so a detection
by rank finds what the completed value finds. The map is linear once B is fixed (Shrinkage.matrix),
so every part of its error follows from the completed value's (valuation_noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MIN_MEMBERS = 3
"""Fewer members with a known error than this: nothing to estimate the spread from, no shrinkage."""


@dataclass(frozen=True)
class Shrinkage:
    """The factors B_i (1 where a member's error is unknown: it is left as it is), the mean the known
    members are pulled to (over the members with a known error) and the estimated spread tau^2."""

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
        between = max(0.0, float(np.var(totals[known], ddof=1) - variance.mean()))
        factors[known] = between / (between + variance) if between > 0 else 0.0
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
