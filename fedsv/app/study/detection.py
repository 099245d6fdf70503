"""Detection curves and their areas: rank participants by value (lowest first), count the bad ones found.

The curve: after inspecting the k lowest-valued of N participants (k = 0..N), the fraction of the B bad
participants found. Ties in value are inspected in random order; the curve is the expectation over
that order (within a tie group of g holding b bad, each inspected member finds b/g on average), so it
needs no seed.

The detection area normalizes the area under that curve between the worst ranking (every bad
participant last) and the best (every bad participant first):

    area = (A - A_worst) / (A_best - A_worst),  A = (1/N) sum_{k=1..N} found(k) / B

1.0 = all bad participants ranked first, 0.0 = all ranked last, and a random ranking has expected
area 0.5 whatever N and B. It equals the probability that a random bad participant is ranked before
a random good one (ties count 1/2): the ROC AUC of "low value" as a detector of "bad".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from fedsv.fl.ranks import participant_id
from fedsv.valuation import FederatedValuation

VALUE_METHODS = ("fedsv", "loo", "fedsv_normalized", "loo_normalized", "fedsv_completed", "fedsv_shrunk")
DETECTION_METHODS = (*VALUE_METHODS, "random")
RANDOM_EXPECTED_AREA = 0.5
LABELS = {
    "fedsv": "Fed. SV",
    "loo": "Fed. LOO",
    "fedsv_normalized": "Fed. SV (normalized)",
    "loo_normalized": "Fed. LOO (normalized)",
    "fedsv_completed": "Fed. SV (completed)",
    "fedsv_shrunk": "Fed. SV (shrunk)",
    "random": "Random",
}


def value_totals(valuation: FederatedValuation, participants: int) -> dict[str, npt.NDArray[np.float64]]:
    """Per method, each rank's total over rounds (index = rank); a participant never valued has 0."""
    index = {participant_id(rank): rank for rank in range(participants)}
    totals = {method: np.zeros(participants) for method in VALUE_METHODS}
    for method, by_participant in valuation.totals().items():
        for pid, total in by_participant.items():
            if pid not in index:
                raise ValueError(f"values of unknown participant {pid!r}")
            totals[method][index[pid]] = total
    return totals


def random_scores(participants: int) -> npt.NDArray[np.float64]:
    """The random baseline as its expectation, not one draw: every participant tied, so the curve is
    the mean over all inspection orders (found(k) = k/N exactly) and the area is exactly 0.5."""
    return np.zeros(participants)


Flags = Sequence[bool] | npt.NDArray[np.bool_]


def detection_curve(scores: Sequence[float] | npt.NDArray[np.float64], bad: Flags) -> np.ndarray:
    """found(k) / B for k = 0..N inspecting lowest scores first (ties: expectation over their order)."""
    values = np.asarray(scores, dtype=np.float64)
    flags = np.asarray(bad, dtype=bool)
    if values.shape != flags.shape or values.ndim != 1:
        raise ValueError(f"scores {values.shape} and bad flags {flags.shape} must be 1-D of one length")
    if not np.all(np.isfinite(values)):
        raise ValueError("scores must be finite")
    total_bad = int(flags.sum())
    if total_bad == 0:
        raise ValueError("no bad participants: the detection curve is undefined")
    found = np.zeros(len(values) + 1)
    k = 0
    for value in np.unique(values):  # ascending
        group = values == value
        g, b = int(group.sum()), int(flags[group].sum())
        base = found[k]
        for j in range(1, g + 1):
            found[k + j] = base + j * b / g
        k += g
    return found / total_bad


def curve_area(curve: np.ndarray, bad_count: int) -> float:
    """The normalized detection area of a curve from detection_curve (see the module docstring)."""
    n = len(curve) - 1
    if n < 1 or not 1 <= bad_count <= n:
        raise ValueError(f"need 1 <= bad_count <= N, got bad_count={bad_count}, N={n}")
    if bad_count == n:
        return 1.0  # every ranking finds all of them at the same pace
    k = np.arange(1, n + 1)
    best = np.minimum(k, bad_count).mean() / bad_count
    worst = np.maximum(0, k - (n - bad_count)).mean() / bad_count
    return float((curve[1:].mean() - worst) / (best - worst))


def detection_area(scores: Sequence[float] | npt.NDArray[np.float64], bad: Flags) -> float:
    """Normalized area of the detection curve of `scores` (1.0 = all bad first, random: 0.5 expected)."""
    return curve_area(detection_curve(scores, bad), int(np.sum(np.asarray(bad, dtype=bool))))


def pairwise_auc(scores: Sequence[float] | npt.NDArray[np.float64], bad: Flags) -> float:
    """P(a bad participant scores below a good one), ties 1/2: equal to detection_area (a cross-check)."""
    values = np.asarray(scores, dtype=np.float64)
    flags = np.asarray(bad, dtype=bool)
    low, high = values[flags][:, None], values[~flags][None, :]
    return float(((low < high) + 0.5 * (low == high)).mean())


def method_scores(
    totals: Mapping[str, npt.NDArray[np.float64]], participants: int
) -> dict[str, npt.NDArray[np.float64]]:
    """Scores (low = suspicious) of every detection method: the value totals and random's expectation."""
    return {**{m: np.asarray(totals[m]) for m in VALUE_METHODS}, "random": random_scores(participants)}
