"""How sure a value is: the standard error of every total against a rerun of the same federation.

A total moves between reruns for three reasons, each estimated from what the run already has (no extra
evaluation, no extra message):

- **the estimator**: a sampled round value's own standard error (0 where exact);
- **the validation set**: a utility that is a mean over validation samples makes each value the mean of
  per-sample values, so the values measured on each of the validation folds alone (by_class.FoldValues)
  spread as a fresh draw of the validation set would move them. A total is summed fold by fold over the
  rounds before the spread is taken, so a member's luck with the validation set, which persists from
  round to round, is counted once and in full;
- **training and selection** (a rerun with another seed): the round-by-participant matrix of values is
  modelled as in the completion (completion.choose: a member's mean, a round's mean, or quality x round
  gain of low rank, chosen by cross-validation); what the model leaves, less the estimator's and the
  validation set's part, is the round's training noise (pooled towards the run's mean, per round, so
  that early rounds with large gains keep their larger noise). Reruns are then simulated: each round
  selects m_t of the N members afresh, every value is the model's plus fresh noise, and every total
  (FedSV, normalized, completed with the same model, LOO) is taken as the run takes it. The spread of
  the simulated totals is that part of the error.

The model's assumptions: noise independent between rounds and members, with the same spread for every
member of a round; members selected uniformly at random; the model fitted on this run standing in for
the federation's. A member whose values are systematically noisier than its round's (a small shard), or
a selection that is not uniform, breaks them: benchmarks/bench_calibration.py measures how the stated
errors compare with the spread of real reruns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedsv.valuation.completion import Model, RoundMatrix, acceptance, choose, completed_totals, fit
from fedsv.valuation.shrinkage import Shrinkage

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

REPLICATES = 200
"""Simulated reruns per run; the relative error of a standard error from R reruns is about 1/sqrt(2R)."""

POOLING = 2.0
"""A round's training noise is pooled towards the run's with this many members' weight."""

COMPONENTS = ("estimator", "validation", "rerun")
"""The parts of a total's standard error, combined in quadrature."""


def fold_stderr(fold_values: FloatArray, shares: FloatArray) -> FloatArray:
    """The validation set's standard error of values split into folds (last axis; they sum to the value):
    the value measured on fold f alone is fold_f / share_f, and the spread of those around the value,
    weighted by the folds' shares, over F - 1, is the variance of the mean over all samples."""
    shares = np.asarray(shares, dtype=np.float64)
    folds = shares.shape[0]
    if folds < 2:
        return np.full(fold_values.shape[:-1], math.nan)
    value = fold_values.sum(axis=-1, keepdims=True)
    alone = fold_values / np.where(shares > 0, shares, 1.0)
    variance = (shares * np.square(alone - value)).sum(axis=-1) / (folds - 1)
    return np.asarray(np.sqrt(variance), dtype=np.float64)


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
    estimator's variance, each round's selection count m_t, and the values per validation fold (T, N, F;
    NaN in rounds not split by fold) with the folds' shares."""

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


@dataclass(frozen=True)
class Uncertainty:
    """Per value (TOTAL_KEYS) and part (COMPONENTS): each participant's standard error (NaN: unknown)."""

    parts: dict[str, dict[str, FloatArray]]
    shrinkage: Shrinkage | None = None  # how the shrunk value is taken from the completed (shrinkage.py)

    def stderr(self, key: str) -> FloatArray:
        """The parts of `key` combined in quadrature (unknown where any part is)."""
        total = sum(np.square(self.parts[part][key]) for part in COMPONENTS)
        return np.asarray(np.sqrt(total), dtype=np.float64)


def _norms(values: FloatArray, mask: BoolArray) -> FloatArray:
    """Each round's L2 norm over its observed values; 1 where a round is all zero (it stays zero)."""
    norms = np.sqrt(np.square(np.where(mask, values, 0.0)).sum(axis=1))
    return np.where(norms > 0, norms, 1.0)


def _validation(
    matrices: RoundMatrices, model: Model | None, seed: int
) -> tuple[dict[str, FloatArray], FloatArray]:
    """Each total's validation part, from its fold totals (NaN where a round it sums was not split), and
    the completed value's fold totals (N, F)."""
    mask, weights, shares = matrices.mask, matrices.weights, matrices.shares
    unsplit = np.isnan(matrices.fedsv_folds).any(axis=2) & mask
    unknown = unsplit.any(axis=0)
    fedsv_f = np.where(mask[..., None], np.nan_to_num(matrices.fedsv_folds), 0.0)
    loo_f = np.where(mask[..., None], np.nan_to_num(matrices.loo_folds), 0.0)
    fedsv_norm, loo_norm = _norms(matrices.fedsv, mask), _norms(matrices.loo, mask)
    totals = {
        "fedsv": fedsv_f.sum(axis=0),
        "fedsv_normalized": (fedsv_f / fedsv_norm[:, None, None]).sum(axis=0),
        "loo": loo_f.sum(axis=0),
        "loo_normalized": (loo_f / loo_norm[:, None, None]).sum(axis=0),
    }
    completed = np.zeros_like(totals["fedsv"])
    for f, share in enumerate(shares):
        alone = fedsv_f[:, :, f] / max(float(share), 1e-12)
        completed[:, f] = share * completed_totals(alone, mask, matrices.accepted, weights, model, seed)
    totals["fedsv_completed"] = completed
    out = {key: fold_stderr(fold_totals, shares) for key, fold_totals in totals.items()}
    for key in out:
        out[key][unknown] = math.nan
    return out, completed


def _estimator(matrices: RoundMatrices) -> dict[str, FloatArray]:
    """Each total's estimator part: rounds are valued independently, so variances add."""
    variance, mask = np.where(matrices.mask, matrices.estimator_variance, 0.0), matrices.mask
    norms = _norms(matrices.fedsv, mask)
    zeros = np.zeros(len(matrices.ids))
    return {
        "fedsv": np.sqrt(variance.sum(axis=0)),
        "fedsv_normalized": np.sqrt((variance / np.square(norms)[:, None]).sum(axis=0)),
        "fedsv_completed": np.sqrt(np.square(matrices.weights) @ variance),
        "loo": zeros,
        "loo_normalized": zeros,
    }


def _parameters(model: Model, rounds: int, members: int) -> int:
    if model.kind == "member means":
        return members
    if model.kind == "round means":
        return rounds
    if model.kind == "rounds and members":
        return rounds + members
    return model.rank * (rounds + members - model.rank)


def training_noise(
    values: FloatArray, mask: BoolArray, known_variance: FloatArray, model: Model, seed: int
) -> tuple[FloatArray, FloatArray] | None:
    """The model's fit of every entry and each entry's training-noise standard deviation (T, N): the
    residuals' variance (corrected for the model's parameters) less what the estimator and the
    validation set explain, per round (pooled towards the run's) times a per-member scale (a member
    with a small shard is noisier; one whose updates never count is not noisy at all; pooled towards
    1); None when the residuals leave no degree of freedom."""
    center = fit(values, mask, model, seed)
    observed = int(mask.sum())
    params = _parameters(model, int(mask.any(axis=1).sum()), int(mask.any(axis=0).sum()))
    if observed - params < 2:
        return None
    residual = np.where(mask, np.square(values - center), 0.0) * observed / (observed - params)
    excess = np.maximum(residual - np.where(mask, np.nan_to_num(known_variance), 0.0), 0.0)
    known = np.where(mask, np.nan_to_num(known_variance), 0.0).sum(axis=1)
    per_round_excess = np.maximum(residual.sum(axis=1) - known, 0.0)
    counts = mask.sum(axis=1)
    pooled = float(per_round_excess.sum() / observed)
    per_round = (per_round_excess + POOLING * pooled) / (counts + POOLING)
    scaled = np.where(mask, excess / np.maximum(per_round, 1e-300)[:, None], 0.0)
    member = (scaled.sum(axis=0) + POOLING) / (mask.sum(axis=0) + POOLING)
    mean_member = float(np.average(member, weights=np.maximum(mask.sum(axis=0), 1e-12)))
    member = member / max(mean_member, 1e-300)  # the rounds' scale is the members' average
    return center, np.sqrt(np.outer(per_round, member))


def _simulate(
    center: FloatArray,
    noise: FloatArray,  # (T, N) standard deviations
    selected: Sequence[int],
    rate: FloatArray,  # each member's share of selected updates aggregated
    model: Model | None,
    completed: bool,
    replicates: int,
    seed: int,
) -> dict[str, FloatArray]:
    """Each member's totals (sum, normalized and completed) over simulated reruns, (replicates, N): each
    round selects afresh, each selected update is aggregated as often as the member's were."""
    rounds, members = center.shape
    rng = np.random.default_rng(seed)
    weights = np.asarray(selected, dtype=np.float64) / members
    draws: dict[str, list[FloatArray]] = {"sum": [], "normalized": [], "completed": []}
    for _ in range(replicates):
        order = rng.random((rounds, members)).argsort(axis=1).argsort(axis=1)
        mask = order < np.asarray(selected)[:, None]
        accepted = mask & (rng.random((rounds, members)) < rate[None, :])
        values = center + noise * rng.standard_normal((rounds, members))
        observed = np.where(accepted, values, 0.0)
        draws["sum"].append(observed.sum(axis=0))
        draws["normalized"].append((observed / _norms(values, accepted)[:, None]).sum(axis=0))
        if completed:
            draws["completed"].append(completed_totals(values, mask, accepted, weights, model, seed))
    return {key: np.array(d) for key, d in draws.items() if d}


def _spread(draws: FloatArray) -> FloatArray:
    return np.asarray(np.std(draws, axis=0, ddof=1), dtype=np.float64)


def _rerun(
    matrices: RoundMatrices, model: Model | None, replicates: int, seed: int
) -> tuple[dict[str, FloatArray], FloatArray | None]:
    """Each total's training-and-selection part, from simulated reruns (NaN where it cannot be told),
    and the completed value's simulated totals (replicates, N), None where there are none."""
    unknown = np.full(len(matrices.ids), math.nan)
    accepted, rate = matrices.accepted, acceptance(matrices.mask, matrices.accepted)
    validation_var = np.square(
        np.nan_to_num(fold_stderr(np.nan_to_num(matrices.fedsv_folds), matrices.shares))
    )
    known = matrices.estimator_variance + validation_var
    noise_model = model or choose(matrices.fedsv, accepted, seed)[0]
    out = dict.fromkeys(("fedsv", "fedsv_normalized", "fedsv_completed", "loo", "loo_normalized"), unknown)
    fedsv = training_noise(matrices.fedsv, accepted, known, noise_model, seed)
    completed = None
    if fedsv is not None:
        draws = _simulate(*fedsv, matrices.selected, rate, model, True, replicates, seed)
        out |= {"fedsv": _spread(draws["sum"]), "fedsv_normalized": _spread(draws["normalized"])}
        completed = draws["completed"]
        out["fedsv_completed"] = _spread(completed)
    loo_validation = np.square(np.nan_to_num(fold_stderr(np.nan_to_num(matrices.loo_folds), matrices.shares)))
    loo = training_noise(matrices.loo, accepted, loo_validation, noise_model, seed)
    if loo is not None:
        draws = _simulate(*loo, matrices.selected, rate, model, False, replicates, seed)
        out |= {"loo": _spread(draws["sum"]), "loo_normalized": _spread(draws["normalized"])}
    return out, completed


LABEL_MODEL = Model("rounds and members", 0, 2.0)
"""The noise model of a validation label's round values: a round's level plus a member's offset."""


def sum_rerun(
    values: FloatArray, matrices: RoundMatrices, seed: int = 0, replicates: int = REPLICATES
) -> FloatArray:
    """The training-and-selection part of the plain sums of another round-by-participant matrix of
    values over the same rounds (a validation label's values): its own noise around LABEL_MODEL, the
    run's selections and acceptance; NaN where it cannot be told."""
    accepted = matrices.accepted
    noise = training_noise(values, accepted, np.zeros_like(values), LABEL_MODEL, seed)
    if noise is None:
        return np.full(values.shape[1], math.nan)
    rate = acceptance(matrices.mask, accepted)
    draws = _simulate(*noise, matrices.selected, rate, None, False, replicates, seed)
    return _spread(draws["sum"])


def _shrunk_rerun(
    draws: FloatArray, result: Uncertainty, parts: dict[str, dict[str, FloatArray]], seed: int
) -> FloatArray:
    """The shrunk value's rerun part: each simulated rerun's completed totals, given the validation set's
    and the estimator's noise too, shrunk with the factors that rerun would estimate (they move with
    its spread), less the parts the shrinkage's linear map already carries."""
    stated = result.stderr("fedsv_completed")
    known = np.sqrt(
        np.square(parts["validation"]["fedsv_completed"]) + np.square(parts["estimator"]["fedsv_completed"])
    )
    noise = np.random.default_rng(seed + 1).standard_normal(draws.shape) * np.nan_to_num(known, posinf=0.0)
    shrunk = np.array([Shrinkage.of(row, stated).apply(row) for row in draws + noise])
    linear = np.square(parts["validation"]["fedsv_shrunk"]) + np.square(parts["estimator"]["fedsv_shrunk"])
    return np.asarray(
        np.sqrt(np.maximum(np.square(_spread(shrunk)) - np.nan_to_num(linear), 0.0)), dtype=np.float64
    )


def uncertainty(
    matrices: RoundMatrices,
    model: Model | None,
    completed: FloatArray | None = None,
    replicates: int = REPLICATES,
    seed: int = 0,
) -> Uncertainty:
    """Every total's standard error by part; `model`: the completion's (None: nothing was missing);
    `completed`: the completed totals, from which the shrunk value (shrinkage.py) and its errors are
    taken (its parts: the completed value's, through the shrinkage's linear map)."""
    never = ~matrices.mask.any(axis=0)
    validation, completed_folds = _validation(matrices, model, seed)
    rerun, completed_draws = _rerun(matrices, model, replicates, seed)
    parts = {"estimator": _estimator(matrices), "validation": validation, "rerun": rerun}
    for part in parts.values():
        part["fedsv_completed"] = np.where(never, math.inf, part["fedsv_completed"])
    result = Uncertainty(parts)
    if completed is None:
        return result
    shrinkage = Shrinkage.of(completed, result.stderr("fedsv_completed"))
    matrix = shrinkage.matrix()
    estimator = parts["estimator"]["fedsv_completed"]
    finite = np.where(np.isfinite(estimator), estimator, 0.0)  # an unknown member's row is its own
    parts["estimator"]["fedsv_shrunk"] = np.where(
        np.isfinite(estimator), np.sqrt(np.square(matrix) @ np.square(finite)), estimator
    )
    parts["validation"]["fedsv_shrunk"] = fold_stderr(shrinkage.apply(completed_folds), matrices.shares)
    parts["rerun"]["fedsv_shrunk"] = (
        np.full(len(matrices.ids), math.nan)
        if completed_draws is None
        else _shrunk_rerun(completed_draws, result, parts, seed)
    )
    for key in ("validation", "rerun"):
        unknown = ~np.isfinite(parts[key]["fedsv_completed"])
        parts[key]["fedsv_shrunk"] = np.where(
            unknown, parts[key]["fedsv_completed"], parts[key]["fedsv_shrunk"]
        )
    return Uncertainty(parts, shrinkage)
