"""A rerun's part of a total's error: the training noise the run's own values show, and reruns of the
run simulated from it (valuation_noise combines it with the estimator's and the validation set's).

The round-by-participant matrix is modelled as the completion does (completion.choose); what the model
leaves, less the estimator's and the validation set's variance, is the training noise of each round
(pooled towards the run's, so that early rounds with large gains keep their larger noise) times a
per-member scale. Reruns are then simulated: each round selects m_t of the N members afresh, each
selected update is aggregated as often as the member's were, values are the model's plus fresh noise,
and every total is taken as the run takes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedsv.valuation.completion import Model, acceptance, choose, completed_totals, fit
from fedsv.valuation.round_matrices import BoolArray, FloatArray, RoundMatrices, fold_stderr, norms

REPLICATES = 200
"""Simulated reruns per run; the relative error of a standard error from R reruns is about 1/sqrt(2R)."""

POOLING = 2.0
"""A round's (and a member's) training noise is pooled towards the run's with this many entries' weight."""


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


def simulate(
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
        draws["normalized"].append((observed / norms(values, accepted)[:, None]).sum(axis=0))
        if completed:
            draws["completed"].append(completed_totals(values, mask, accepted, weights, model, seed))
    return {key: np.array(d) for key, d in draws.items() if d}


def spread(draws: FloatArray) -> FloatArray:
    return np.asarray(np.std(draws, axis=0, ddof=1), dtype=np.float64)


def rerun_part(
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
        draws = simulate(*fedsv, matrices.selected, rate, model, True, replicates, seed)
        out |= {"fedsv": spread(draws["sum"]), "fedsv_normalized": spread(draws["normalized"])}
        completed = draws["completed"]
        out["fedsv_completed"] = spread(completed)
    loo_validation = np.square(np.nan_to_num(fold_stderr(np.nan_to_num(matrices.loo_folds), matrices.shares)))
    loo = training_noise(matrices.loo, accepted, loo_validation, noise_model, seed)
    if loo is not None:
        draws = simulate(*loo, matrices.selected, rate, model, False, replicates, seed)
        out |= {"loo": spread(draws["sum"]), "loo_normalized": spread(draws["normalized"])}
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
    draws = simulate(*noise, matrices.selected, rate, None, False, replicates, seed)
    return spread(draws["sum"])
