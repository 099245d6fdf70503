"""A run's round values as round-by-participant matrices, and the validation set's error from folds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedsv.valuation.accounting.completion import RoundMatrix

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def fold_deviations(fold_values: FloatArray, shares: FloatArray) -> FloatArray | None:
    """(F, ...): each fold's deviation of fold values (T, N, F) from the value, scaled so that their
    squares sum to fold_stderr's variance (0 where a round was not split); None with fewer than 2 folds."""
    shares = np.asarray(shares, dtype=np.float64)
    folds = shares.shape[0]
    if folds < 2:
        return None
    fold_values = np.nan_to_num(fold_values)
    alone = fold_values / np.where(shares > 0, shares, 1.0)
    deviation = (alone - fold_values.sum(axis=-1, keepdims=True)) * np.sqrt(shares / (folds - 1))
    return np.asarray(np.moveaxis(deviation, -1, 0), dtype=np.float64)


def centered(totals: FloatArray, members: BoolArray, axis: int = -1) -> FloatArray:
    """Totals less the mean over `members` along `axis` (the members' axis): what moves every member
    alike (a round's level, another initial model) cancels, what sets one apart stays."""
    chosen = np.compress(members, totals, axis=axis)
    mean = chosen.mean(axis=axis, keepdims=True) if chosen.shape[axis] else 0.0
    return np.asarray(totals - mean, dtype=np.float64)


def merge_folds(fold_values: FloatArray, shares: FloatArray, folds: int) -> tuple[FloatArray, FloatArray]:
    """Fold values (last axis) of a finer split merged into `folds` (fold f' holds the f with f % folds =
    f': class_scores.FOLDS nest), and the merged shares."""
    out = np.zeros((*fold_values.shape[:-1], folds))
    merged = np.zeros(folds)
    for f in range(shares.shape[0]):
        out[..., f % folds] += fold_values[..., f]
        merged[f % folds] += shares[f]
    return out, merged


@dataclass(frozen=True)
class RoundMatrices:
    """A run's round values as round-by-participant matrices (observed where `mask`): FedSV, LOO, the
    estimator's variance, each round's selection count m_t, the values per validation fold (T, N, F;
    NaN in rounds not split by fold) with the folds' shares, and how much the first round's gain would
    move with another initial model (initial_spread.py; NaN: not measured)."""

    ids: list[str]
    fedsv: FloatArray
    loo: FloatArray
    mask: BoolArray
    estimator_variance: FloatArray
    selected: list[int]
    fedsv_folds: FloatArray
    loo_folds: FloatArray
    shares: FloatArray
    accepted: BoolArray  # the selected updates that were aggregated (the others are valued 0)
    initial_spread: float = math.nan  # the SD of U(w_0) over initial models (0: round 1 is not here)
    balanced: bool = False  # the run selected by the balanced rule: a rerun is simulated by it too

    @property
    def rounds(self) -> int:
        return int(self.fedsv.shape[0])

    def completion_matrix(self) -> RoundMatrix:
        """What a completion starts from: FedSV with its estimator's errors."""
        errors = np.sqrt(self.estimator_variance)
        return RoundMatrix(self.ids, self.fedsv, errors, self.mask, self.selected, self.accepted)

    @property
    def weights(self) -> FloatArray:
        """Each round's selection probability m_t / N (the completion's weights)."""
        return np.asarray(self.selected, dtype=np.float64) / max(len(self.ids), 1)


def norms(values: FloatArray, mask: BoolArray) -> FloatArray:
    """Each round's L2 norm over its observed values; 1 where a round is all zero (it stays zero)."""
    lengths = np.sqrt(np.square(np.where(mask, values, 0.0)).sum(axis=1))
    return np.where(lengths > 0, lengths, 1.0)
