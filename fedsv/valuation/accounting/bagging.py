"""The shrunk value's pull averaged over the groups the verdict finds in simulated reruns (bagging).

The verdict's groups are a hard decision: a member whose total sits near the edge of a group is pulled
towards it in one run and not in the next, and the group's mean it is pulled to changes with the
members that happened to join. The shrunk value then moves between reruns more than the completed
totals it is made from, and jumps when a member's evidence moves a little across the edge.

Averaged over reruns simulated from the run's own noise (the deviations of rerun_noise's simulated
completed totals from their mean: what a rerun would move each total by), the pull becomes a smooth
function of the evidence (Breiman's bagging; Buehlmann and Yu, "Analyzing bagging", 2002: averaging
a hard threshold over resamples cuts its variance most where the decision is closest). Each draw finds
its groups in the totals moved by one deviation (verdict_groups), and the pull within them is fitted to
the run's own totals (shrinkage.Shrinkage.fit); the value is the average of those linear maps, so it is
linear in the completed totals once fitted, as each map is, and the estimator's and the validation
set's parts of its error follow through it (valuation_noise).

Where the draws start (AROUND): the run's totals already hold one rerun's noise, so totals moved by
another deviation spread as two reruns' noise would, and the verdict splits equals in them far more
often than in a real rerun (twenty equals kept a third of their spread on average, where the pull
within the run's own groups kept a sixth: tests/unit/test_bagging.py). The draws start from the
totals as the pull fits the truth (each total pulled towards its group by the square root of its
factor, Shrinkage.as_fitted), and that fit is itself the average over draws from the run's totals,
so the start, too, moves smoothly with the evidence: equals keep a seventh of their spread, and a
member's value moves by at most 0.16 errors for a step of 0.05 (started from the run's own groups'
fit instead, 0.53: a third of the hard pull's jump).

What follows: members the verdict groups in nearly every draw (twins, equals) are pulled together
nearly as before; a member the verdict sets apart in nearly every draw (a free rider, a member whose
data damage the model) keeps nearly all its completed total; a member near an edge is pulled in
proportion to how often a rerun would group it. Measured where the truth is known
(benchmarks/bench_pull.py) and on the calibration federations (docs/decisions/0005).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedsv.valuation.accounting.round_matrices import BoolArray, FloatArray
from fedsv.valuation.accounting.shrinkage import Fits, Shrinkage
from fedsv.valuation.accounting.verdict import Groups, column_groups, column_labels

BAGS = 50
"""Draws the run's pull is averaged over: a member grouped in a share p of reruns is pulled by p to
within about sqrt(p (1 - p) / BAGS), 0.07 at most."""

AROUND = "bag"
"""Where the draws start: "bag", the run's totals as the pull averaged over draws from them fits the
truth (as_fitted; twice the fits); "fit", as the run's own groups' fit does (jumps where those groups
change); "totals", the run's totals (their noise counts twice). Measured: docs/decisions/0005."""

INNER = 8
"""Draws each simulated rerun's own pull is averaged over (its part of the shrunk value's rerun error:
BAGS per rerun would cost REPLICATES times as much; 8 and 40 gave the same stated errors to 0.02)."""


def verdict_groups(ids: Sequence[str], totals: FloatArray, between: FloatArray) -> Groups:
    """The verdict's groups (verdict.py) of completed totals by their errors against the members' mean
    (`between`), as column indices: the members the shrunk value pulls each other towards. None (one
    group) where the verdict cannot test (fewer than two members with a known error)."""
    return column_groups(
        ids, np.asarray(totals, dtype=np.float64)[None], np.asarray(between, dtype=np.float64)
    )[0]


@dataclass(frozen=True)
class Pull:
    """The fitted pull: the (N, N) linear map from completed totals to shrunk ones, its counterpart with
    each factor's square root (as_fitted), and how many draws it was averaged over (1: the run's own
    groups, unaveraged)."""

    full: FloatArray
    half: FloatArray
    draws: int

    @classmethod
    def of(cls, fits: Sequence[Shrinkage]) -> Pull:
        """The average of fitted pulls (one or more)."""
        full = np.mean([fit.map() for fit in fits], axis=0)
        half = np.mean([fit.map(0.5) for fit in fits], axis=0)
        return cls(np.asarray(full, dtype=np.float64), np.asarray(half, dtype=np.float64), len(fits))

    def map(self) -> FloatArray:
        """The (N, N) map from completed totals to shrunk ones."""
        return self.full

    def apply(self, totals: FloatArray) -> FloatArray:
        """The shrunk totals of completed totals (..., N)."""
        return np.asarray(np.einsum("ij,...j->...i", self.full, totals), dtype=np.float64)

    def as_fitted(self, totals: FloatArray) -> FloatArray:
        """Totals (..., N) that spread within their groups as the fit estimates the true totals do, to
        simulate reruns from (Shrinkage.as_fitted, averaged as the pull is)."""
        return np.asarray(np.einsum("ij,...j->...i", self.half, totals), dtype=np.float64)


def bagged(
    ids: Sequence[str],
    totals: FloatArray,
    errors: FloatArray,
    members: BoolArray | None,
    deviations: FloatArray | None,
) -> Pull:
    """The pull of completed `totals` (N,) with `errors` against the members' mean, averaged over the
    verdict's groups of the totals (started where AROUND says) moved by each row of `deviations`
    (draws, N: what a rerun would move them by; NaN counts as 0); with none, the pull within the run's
    own groups. `members`: those with an aggregated update (Shrinkage.fit)."""
    if deviations is None or deviations.shape[0] == 0 or AROUND == "fit":
        own = Shrinkage.fit(totals, errors, verdict_groups(ids, totals, errors), members)
        if deviations is None or deviations.shape[0] == 0:
            return Pull.of([own])
    shifts = np.nan_to_num(deviations, nan=0.0, posinf=0.0, neginf=0.0)
    if AROUND == "fit":
        center = own.as_fitted(totals)
    elif AROUND == "bag":
        center = _averaged(ids, totals, errors, members, totals + shifts).as_fitted(totals)
    else:
        center = totals
    return _averaged(ids, totals, errors, members, center + shifts)


def _averaged(
    ids: Sequence[str], totals: FloatArray, errors: FloatArray, members: BoolArray | None, moved: FloatArray
) -> Pull:
    """The pull fitted to `totals` within each row of `moved`'s groups, averaged."""
    fits = Fits.of(totals, errors, _groupings(ids, moved, errors), members)
    return Pull(fits.maps(), fits.maps(0.5), moved.shape[0])


def _groupings(
    ids: Sequence[str], moved: FloatArray, errors: FloatArray
) -> list[Groups] | npt.NDArray[np.int64]:
    """The verdict's groups of each row of `moved`: as labels, walked at once, where verdict()'s own rules
    are not needed (verdict.column_labels), else as lists."""
    labels = column_labels(ids, moved, errors)
    return labels.by_column() if labels is not None else column_groups(ids, moved, errors)


def pulled_many(
    ids: Sequence[str],
    totals: FloatArray,
    errors: FloatArray,
    members: BoolArray | None,
    deviations: FloatArray,
) -> FloatArray:
    """Each row of `totals` (R, N) pulled as bagged(ids, row, errors, members, deviations).apply(row)
    pulls it, every row's draws (R x D) grouped and fitted at once: what a rerun's part of the shrunk
    value's error takes for each of its simulated reruns."""
    rows, draws = totals.shape[0], deviations.shape[0]
    if AROUND != "bag" or draws == 0 or rows == 0:
        return np.array([bagged(ids, row, errors, members, deviations).apply(row) for row in totals])
    shifts = np.nan_to_num(deviations, nan=0.0, posinf=0.0, neginf=0.0)
    each = np.repeat(totals, draws, axis=0)  # (R x D, N): row r's totals for each of its draws

    def averaged(start: FloatArray, power: float) -> FloatArray:
        moved = (start[:, None, :] + shifts[None, :, :]).reshape(rows * draws, -1)
        fits = Fits.of(each, errors, _groupings(ids, moved, errors), members)
        return np.asarray(fits.applied(each, power).reshape(rows, draws, -1).mean(axis=1), dtype=np.float64)

    return averaged(averaged(totals, 0.5), 1.0)
