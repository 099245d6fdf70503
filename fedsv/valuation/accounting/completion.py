"""Completed federated Shapley values: every participant valued in every round, not only when selected.

Fan et al. ("Improving Fairness for Data Valuation in Horizontal Federated Learning", ICDE 2022) note
that FedSV pays for selection luck: two members with the same data end with different totals when one
was selected more often, or in earlier rounds, when the gains were larger. Their completed FedSV
(ComFedSV) fills in the round-by-coalition utility matrix U[t, S] (observed only for S within round
t's selection) with a low-rank model and takes every round's Shapley value over all N members.

fedsv follows the same idea, a low-rank completion of what was not observed, on the round-by-
participant matrix of values V[t, i] (participant i's FedSV in round t, observed when it was
selected) instead of the utility matrix, and weighs each round by its selection probability:

    fedsv_completed_i = sum_t (m_t / N) * V^[t, i],   V^ = V where observed, else predicted

  The prediction is a low-rank fit A B^T (rank 1 to 3, ridge-penalised), or one of two plain models:
  a member's mean observed value, or the round's mean observed value. Cross-validation on held-out
  observed entries chooses among them (rank and penalty included): with little to learn from, as
  when per-round values are mostly noise, a member's own average is often the best guess there is.
  Every prediction is held within the range of the values observed in its round and of its member:
  a low-rank fit can learn a sign change from a few members (labels flipped: useful in the first
  rounds, harmful later) and carry it, negated, to members never seen in those rounds. On the main
  job's federation this imputed honest members -0.2 in the first rounds, where every observed value
  was >= 0, and completed them to -0.08 against a FedSV of +0.06 to +0.14 (docs/decisions/0008). The
  bound costs the best and worst members a little where their truth lies beyond everything observed.

- Why not the utility matrix: at the paper's scale (N = 100) it has 2^100 columns, and a coalition
  larger than every round's selection is never observed in any round, so no completion can recover
  its column; the Shapley value over N members needs exactly those. V is the image of U under the
  (linear) Shapley map of each round, so it inherits U's low rank, and it is small (T x N).
- Why the weights: a round's values split the gain of the m_t selected; summed over every round a
  member would be paid as if selected in all of them. Weighted by m_t / N, the probability of being
  selected, the completed total is the expectation of FedSV over the selection: what FedSV pays a
  member on average, selection luck removed. With every member in every round (m_t = N) nothing is
  missing and the completed values are the FedSV values.
- Its uncertainty: the observed entries keep their estimator's standard errors here; the validation
  set's and a rerun's parts (which hold the predicted entries' error) come from valuation_noise. A
  member never selected has no row to complete: its completed value is 0, with an unknown error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedsv.valuation.accounting.low_rank import als

FloatArray = npt.NDArray[np.float64]

RANKS = (1, 2, 3)
"""The ranks of the low-rank fits tried."""

RIDGES = (1e-6, 1e-4, 1e-2, 1.0)
"""Ridge penalties on the factors tried, relative to the observed entries' root mean square times the
mean number of observed entries per row (a factor's entries scale as the square root of a value)."""

FOLDS = 5
ADDITIVE_ITERATIONS = 25


@dataclass(frozen=True)
class Model:
    """How missing entries are predicted: "round means" (a round's mean observed value), "member
    means" (the member's mean observed value), "rounds and members" (a round's level plus a member's
    offset, the offset pulled towards 0 by `ridge` observations' worth: between the two means), or
    "low rank" (A B^T of `rank`, with `ridge`)."""

    kind: str
    rank: int = 0
    ridge: float = 0.0

    def __str__(self) -> str:
        if self.kind == "low rank":
            return f"rank {self.rank}, ridge {self.ridge:g}"
        return f"rounds and members, ridge {self.ridge:g}" if self.kind == "rounds and members" else self.kind


OFFSET_RIDGES = (0.0, 2.0, 8.0)
"""The pulls on a member's offset tried, in observations' worth."""

CANDIDATES = (
    Model("round means"),
    Model("member means"),
    *(Model("rounds and members", 0, ridge) for ridge in OFFSET_RIDGES),
    *(Model("low rank", rank, ridge) for rank in RANKS for ridge in RIDGES),
)
"""The models cross-validation chooses from, simplest first (ties go to the simpler)."""


@dataclass(frozen=True)
class Completed:
    """Completed totals per participant (columns of the matrix), their standard errors, and how the
    completion went: the model chosen ("nothing missing" when nothing was), its cross-validated RMSE on
    held-out observed entries, and the share of the matrix observed."""

    totals: FloatArray
    stderr: FloatArray  # the estimator's part (observed entries' errors); valuation_noise adds the rest
    model: str
    holdout_rmse: float
    observed: float
    chosen: Model | None = None  # the model that filled the missing entries (None: nothing missing)


@dataclass(frozen=True)
class RoundMatrix:
    """What a completion starts from: the participants (columns), and per round (rows) their values,
    standard errors and whether they were selected (mask); `selected` is m_t, each row's selection;
    `accepted`: which selected updates were aggregated (None: all), the others valued 0."""

    ids: list[str]
    values: FloatArray
    errors: FloatArray
    mask: npt.NDArray[np.bool_]
    selected: list[int]
    accepted: npt.NDArray[np.bool_] | None = None

    @property
    def rounds(self) -> int:
        return int(self.values.shape[0])

    def complete(self, seed: int = 0) -> Completed:
        return complete(
            self.values, self.mask, self.errors, self.selected, len(self.ids), seed, self.accepted
        )


def acceptance(mask: npt.NDArray[np.bool_], accepted: npt.NDArray[np.bool_]) -> FloatArray:
    """Each member's share of its selected updates that were aggregated (1 for one never selected);
    (T, N) masks give (N,), stacked (R, T, N) ones (R, N)."""
    selected = mask.sum(axis=-2)
    return np.where(selected > 0, accepted.sum(axis=-2) / np.maximum(selected, 1), 1.0)


def completed_totals(
    values: FloatArray,
    mask: npt.NDArray[np.bool_],
    accepted: npt.NDArray[np.bool_],
    weights: FloatArray,
    model: Model | None,
    seed: int = 0,
) -> FloatArray:
    """sum_t weights_t V^[t, i]: V^ the value where selected (0 where turned away), else the model's
    prediction from the aggregated updates times the member's acceptance: a member whose updates are
    turned away is predicted to be turned away as often where it was not selected. (T, N) arrays give
    (N,); stacked (R, T, N) ones, R reruns' matrices fitted together, give (R, N)."""
    filled = np.where(accepted, values, 0.0)
    if model is not None:
        predicted = fit(filled, accepted, model, seed) * acceptance(mask, accepted)[..., None, :]
        filled = np.where(mask, filled, predicted)
    return np.asarray(weights @ filled, dtype=np.float64)


def _within_observed(predicted: FloatArray, values: FloatArray, mask: npt.NDArray[np.bool_]) -> FloatArray:
    """Each prediction held within the range of the values observed in its round together with those
    observed of its member (a round or a member with none observed adds no bound); (..., T, N)."""

    def bounds(axis: int) -> tuple[FloatArray, FloatArray]:
        low = np.where(mask, values, np.inf).min(axis=axis)
        high = np.where(mask, values, -np.inf).max(axis=axis)
        return np.expand_dims(low, axis), np.expand_dims(high, axis)

    (round_low, round_high), (member_low, member_high) = bounds(-1), bounds(-2)
    low, high = np.minimum(round_low, member_low), np.maximum(round_high, member_high)
    rounds, members = mask.any(axis=-1, keepdims=True), mask.any(axis=-2, keepdims=True)
    unbounded = ~(rounds | members)  # an empty side's bounds are +-inf: the other's hold
    low, high = np.where(unbounded, -np.inf, low), np.where(unbounded, np.inf, high)
    return np.asarray(np.clip(predicted, low, high), dtype=np.float64)


def _fit(values: FloatArray, mask: npt.NDArray[np.bool_], model: Model, seed: int) -> FloatArray:
    """The model's prediction of every entry from the masked ones; (T, N) or stacked (R, T, N), each
    matrix fitted on its own."""
    if values.ndim == 2:
        return _fit(values[None], mask[None], model, seed)[0]
    observed, count = np.where(mask, values, 0.0), mask.astype(np.float64)
    if model.kind in ("round means", "member means"):
        axis = -1 if model.kind == "round means" else -2
        means = observed.sum(axis=axis, keepdims=True) / np.maximum(count.sum(axis=axis, keepdims=True), 1)
        return np.broadcast_to(means, values.shape).copy()
    if model.kind == "rounds and members":
        return _additive(values, mask, model.ridge)
    square = np.square(observed).sum(axis=(1, 2)) / np.maximum(count.sum(axis=(1, 2)), 1)
    scale = np.sqrt(square) * np.maximum(count.sum(axis=2).mean(axis=1), 1.0)
    return als(values, mask, model.rank, model.ridge * np.maximum(scale, 1e-30), seed)


def _additive(values: FloatArray, mask: npt.NDArray[np.bool_], ridge: float) -> FloatArray:
    """level_t + offset_i fitted to the masked entries by alternating means, each offset the mean of the
    member's residuals over its observations plus `ridge` (so pulled towards 0); (R, T, N)."""
    weights = mask.astype(np.float64)
    observed = np.where(mask, values, 0.0)
    rows, columns = np.maximum(weights.sum(axis=2), 1.0), weights.sum(axis=1)
    offset = np.zeros((values.shape[0], values.shape[2]))
    for _ in range(ADDITIVE_ITERATIONS):
        level = (observed - weights * offset[:, None, :]).sum(axis=2) / rows
        offset = (observed - weights * level[:, :, None]).sum(axis=1) / np.maximum(columns + ridge, 1e-12)
    return np.asarray(level[:, :, None] + offset[:, None, :], dtype=np.float64)


def _holdout_rmse(values: FloatArray, mask: npt.NDArray[np.bool_], model: Model, seed: int) -> float:
    """Root-mean-square error of the completion on observed entries held out, FOLDS folds (fitted
    together, each on its own)."""
    observed = np.argwhere(mask)
    if observed.shape[0] < 2 * FOLDS:
        return math.inf
    folds = np.random.default_rng(seed).permutation(observed.shape[0]) % FOLDS
    train = np.repeat(mask[None], FOLDS, axis=0)
    train[folds, observed[:, 0], observed[:, 1]] = False
    fits = _fit(np.broadcast_to(values, train.shape), train, model, seed)
    errors = [
        fits[k, held[:, 0], held[:, 1]] - values[held[:, 0], held[:, 1]]
        for k in range(FOLDS)
        for held in [observed[folds == k]]
    ]
    return float(np.sqrt(np.mean(np.square(np.concatenate(errors)))))


def choose(
    values: FloatArray,
    mask: npt.NDArray[np.bool_],
    seed: int = 0,
    candidates: Sequence[Model] = CANDIDATES,
) -> tuple[Model, float]:
    """The candidate model (of `candidates`, simplest first) with the smallest cross-validated RMSE
    (ties to the simpler) and that RMSE."""
    scores = [_holdout_rmse(values, mask, candidate, seed) for candidate in candidates]
    best = min(range(len(candidates)), key=lambda k: (scores[k], k))
    return candidates[best], scores[best]


def fit(values: FloatArray, mask: npt.NDArray[np.bool_], model: Model, seed: int = 0) -> FloatArray:
    """`model`'s prediction of every entry of the round-by-participant matrix from the masked ones, each
    held within the range of the values observed in its round and of its member (cross-validation
    chooses the model on its plain predictions: measured, nearer the reruns' mean on three calibration
    federations of four than choosing on the held ones, docs/decisions/0008); (T, N) or (R, T, N)."""
    filled = np.where(mask, values, 0.0)
    return _within_observed(_fit(filled, mask, model, seed), filled, mask)


def complete(
    values: FloatArray,
    mask: npt.NDArray[np.bool_],
    errors: FloatArray,
    selected: Sequence[int],
    world: int,
    seed: int = 0,
    accepted: npt.NDArray[np.bool_] | None = None,
) -> Completed:
    """The completed totals of a round-by-participant matrix of values and their estimator's standard
    errors (valuation_noise adds the validation set's and a rerun's).

    values, errors (T, N): the observed values and their standard errors where `mask` is True;
    selected: the number of participants selected in each round (m_t); world: N; accepted: the
    selected updates that were aggregated (None: all), the model is fitted on those alone.
    """
    accepted = mask if accepted is None else accepted & mask
    values = np.where(accepted, values, 0.0)
    weights = np.asarray(selected, dtype=np.float64) / float(world)
    chosen: Model | None = None
    if mask.all():
        model, rmse = "nothing missing", 0.0
    else:
        chosen, rmse = choose(values, accepted, seed)
        model = str(chosen)
    totals = completed_totals(values, mask, accepted, weights, chosen, seed)
    stderr = np.sqrt(np.square(weights) @ np.square(np.where(mask, errors, 0.0)))
    never = ~mask.any(axis=0)
    totals[never], stderr[never] = 0.0, math.inf
    observed = float(mask.mean()) if mask.size else 0.0
    return Completed(
        np.asarray(totals, dtype=np.float64),
        np.asarray(stderr, dtype=np.float64),
        model,
        rmse,
        observed,
        chosen,
    )
