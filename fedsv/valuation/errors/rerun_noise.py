"""A rerun's parts of a total's error: the training noise the run's own values show, another initial
model, and reruns of the run simulated from them (valuation_noise combines them with the estimator's
and the validation set's parts).

The round-by-participant matrix is modelled as the completion does (its model; where nothing was
missing, or that model spends over half the observed entries, the model within that cap leaving the
least residual variance per degree of freedom: noise_model); what the model leaves, less the estimator's
and the validation set's variance, is the training noise of each round (pooled towards the run's, so
that early rounds with large gains keep their larger noise) times a per-member scale, persistent over
rounds (noise_persistence). Reruns are then simulated: each round selects m_t of the N members afresh,
each selected update is aggregated as often as the member's were, values are the model's plus fresh
noise, the first round's gain moves by a draw of the initial models' spread (initial_spread), and every
total is taken as the run takes it. The same reruns without that draw give the training-and-selection
part; their difference, the initial model's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedsv.fl.selection import balanced_schedule
from fedsv.valuation.accounting.completion import (
    CANDIDATES,
    Model,
    acceptance,
    completed_totals,
    fit,
)
from fedsv.valuation.accounting.round_matrices import (
    BoolArray,
    FloatArray,
    RoundMatrices,
    centered,
    fold_deviations,
    norms,
)
from fedsv.valuation.errors.noise_persistence import TrainingNoise, absorbed, residuals

REPLICATES = 200
"""Simulated reruns per run; the relative error of a standard error from R reruns is about 1/sqrt(2R)."""

POOLING = 2.0
"""A round's (and a member's) training noise is pooled towards the run's with this many entries' weight."""


def _parameters(model: Model, rounds: int, members: int) -> int:
    """The parameters `model` spends on a `rounds` x `members` matrix (a rank above the matrix's own is
    the matrix itself: every entry a parameter)."""
    if model.kind == "member means":
        return members
    if model.kind == "round means":
        return rounds
    if model.kind == "rounds and members":
        return rounds + members
    rank = min(model.rank, rounds, members)
    return rank * (rounds + members - rank)


NOISE_PARAMETERS = 0.5
"""The most parameters a noise model may spend, as a share of the observed entries: the noise is sized
from its residuals in the run, corrected for its parameters as a least-squares fit's would be, and a
low-rank fit near saturation takes more of the noise than its parameters count (in the duplicates
benchmark's seed 1 a rank-3 fit of 80 entries with 45 parameters left residuals of 0.0025 against its
held-out 0.0177, and stated rerun errors 4x too small). docs/decisions/0004-error-model.md."""


def noise_model(values: FloatArray, mask: BoolArray, model: Model | None, seed: int) -> Model:
    """The model the training noise is sized around: the completion's (`model`) unless it is None
    (nothing was missing) or spends more than NOISE_PARAMETERS of the observed entries; then, of the
    candidates that do not, the one whose residuals leave the least variance per degree of freedom
    left (the simplest where none is within the cap). Not cross-validation's choice: the noise is
    sized from the residuals, and a model that predicts held-out entries as well as another while it
    leaves a structure in the run (the first round's gains, ten times the others', which a model of
    round levels plus member offsets cannot hold) counts that structure as noise; on the cross-silo
    federation that stated 1.4-3.2x the errors in 5 runs of 32 (docs/decisions/0004-error-model.md)."""
    rounds, members = int(mask.any(axis=1).sum()), int(mask.any(axis=0).sum())
    observed = float(mask.sum())
    limit = NOISE_PARAMETERS * observed
    if model is not None and _parameters(model, rounds, members) <= limit:
        return model
    within = [m for m in CANDIDATES if _parameters(m, rounds, members) <= limit]
    if not within:
        return min(CANDIDATES, key=lambda m: _parameters(m, rounds, members))

    def left_per_freedom(candidate: Model) -> float:
        left = np.where(mask, values - fit(values, mask, candidate, seed), 0.0)
        return float(np.square(left).sum()) / max(observed - _parameters(candidate, rounds, members), 1.0)

    scores = [left_per_freedom(candidate) for candidate in within]
    return within[min(range(len(within)), key=lambda k: (scores[k], k))]


def training_noise(
    values: FloatArray,
    mask: BoolArray,
    estimator_variance: FloatArray,
    validation: FloatArray | None,
    model: Model,
    seed: int,
) -> TrainingNoise | None:
    """The model's fit of every entry, each entry's training-noise standard deviation (T, N) and its
    persistence over rounds (noise_persistence): the residuals' variance less what the estimator and
    the validation set explain (`validation`: the fold deviations, round_matrices.fold_deviations,
    passed through the same fit, so that what the model absorbs of the validation set's persistent
    noise is not taken out twice), corrected for the model's parameters, per round (pooled towards the
    run's) times a per-member scale (a member with a small shard is noisier; one whose updates never
    count is not noisy at all; pooled towards 1); None when the residuals leave no degree of freedom."""
    center = fit(values, mask, model, seed)
    observed = int(mask.sum())
    params = _parameters(model, int(mask.any(axis=1).sum()), int(mask.any(axis=0).sum()))
    if observed - params < 2:
        return None
    kept = (observed - params) / observed
    residual = np.where(mask, values - center, 0.0)
    seen = (
        None
        if validation is None
        else residuals(validation, np.broadcast_to(mask, validation.shape), model, seed)
    )
    explained = kept * np.where(mask, np.nan_to_num(estimator_variance), 0.0)
    if seen is not None:
        explained = explained + np.square(seen).sum(axis=0)
    training = (np.square(residual) - explained) / kept
    excess = np.where(mask, np.maximum(training, 0.0), 0.0)
    per_round_excess = np.maximum(np.where(mask, training, 0.0).sum(axis=1), 0.0)
    counts = mask.sum(axis=1)
    rows = counts > 0
    pooled = float(np.median(per_round_excess[rows] / counts[rows])) if rows.any() else 0.0
    per_round = (per_round_excess + POOLING * pooled) / (counts + POOLING)
    scaled = np.where(mask, excess / np.maximum(per_round, 1e-300)[:, None], 0.0)
    member = (scaled.sum(axis=0) + POOLING) / (mask.sum(axis=0) + POOLING)
    mean_member = float(np.average(member, weights=np.maximum(mask.sum(axis=0), 1e-12)))
    member = member / max(mean_member, 1e-300)  # the rounds' scale is the members' average
    noise = TrainingNoise(center, np.sqrt(np.outer(per_round, member)))
    return absorbed(noise, mask, model, seed)


@dataclass(frozen=True)
class Replicate:
    """One simulated rerun: its selections, the updates aggregated, the values (the noise model's plus
    fresh noise, the first round's gain moved by a draw of the initial models' spread, unless that draw
    is off) and the standard normal draws that scale the validation set's fold deviations."""

    mask: BoolArray
    accepted: BoolArray
    values: FloatArray
    folds: FloatArray


def replicates(
    noise: TrainingNoise,
    selected: Sequence[int],
    rate: FloatArray,  # each member's share of selected updates aggregated
    folds: int,  # how many fold deviations the validation set's noise is drawn over
    count: int,
    seed: int,
    initial: float = 0.0,  # the SD of the first round's gain over initial models
    balanced: bool = False,  # the run drew by the balanced rule (fedsv.fl.selection)
) -> list[Replicate]:
    """Simulated reruns: each round selects m_t of the N members as the run's rule does (balanced: a
    schedule from another seed; independent: afresh), each selected update is aggregated as often as
    the member's were."""
    rounds, members = noise.center.shape
    rng = np.random.default_rng(seed)
    # the balanced rule selects the same K every round; a run that selected otherwise is drawn afresh
    scheduled = balanced and len(set(selected)) == 1 and 0 < selected[0] < members
    out = []
    for _ in range(count):
        if scheduled:
            mask = np.zeros((rounds, members), dtype=np.bool_)
            plan = balanced_schedule(int(rng.integers(2**31)), members, selected[0], rounds)
            for t, ranks in enumerate(plan):
                mask[t, ranks] = True
        else:
            order = rng.random((rounds, members)).argsort(axis=1).argsort(axis=1)
            mask = order < np.asarray(selected)[:, None]
        accepted = mask & (rng.random((rounds, members)) < rate[None, :])
        values = noise.draw(rng)
        values[0] -= initial * rng.standard_normal() / max(selected[0], 1)
        out.append(Replicate(mask, accepted, values, rng.standard_normal(folds)))
    return out


def simulate(
    draws: Sequence[Replicate], selected: Sequence[int], model: Model | None, completed: bool, seed: int
) -> dict[str, FloatArray]:
    """Each member's totals over simulated reruns, (replicates, N): the sum and the normalized sum; if
    `completed`, the completed value too (the completion refitted with `model` in every rerun)."""
    weights = np.asarray(selected, dtype=np.float64) / draws[0].values.shape[1] if draws else np.ones(0)
    out: dict[str, list[FloatArray]] = {"sum": [], "normalized": []}
    for draw in draws:
        observed = np.where(draw.accepted, draw.values, 0.0)
        out["sum"].append(observed.sum(axis=0))
        out["normalized"].append((observed / norms(draw.values, draw.accepted)[:, None]).sum(axis=0))
    found = {key: np.array(d) for key, d in out.items() if d}
    if completed and draws:  # every rerun's completion fitted at once (stacked), each on its own
        values, mask, accepted = (
            np.array([getattr(d, name) for d in draws]) for name in ("values", "mask", "accepted")
        )
        found["completed"] = completed_totals(values, mask, accepted, weights, model, seed)
    return found


def spread(draws: FloatArray) -> FloatArray:
    return np.asarray(np.std(draws, axis=0, ddof=1), dtype=np.float64)


@dataclass(frozen=True)
class RerunPart:
    """A rerun's parts of each total's error (NaN: cannot be told): training and selection (`rerun`),
    and another initial model (`initial`: it moves every member's total alike, so it does not weigh
    on how far apart two members are); and the completed totals of the simulated reruns without and
    with the initial model's draw (replicates, N; None where there are none), from which
    valuation_noise takes the shrunk value's parts."""

    rerun: dict[str, FloatArray]
    initial: dict[str, FloatArray]
    relative: dict[str, FloatArray]  # training and selection, each member against the members' mean
    completed: FloatArray | None = None
    completed_moved: FloatArray | None = None


def rerun_part(matrices: RoundMatrices, model: Model | None, count: int, seed: int) -> RerunPart:
    """Each total's training-and-selection part and initial model's part, from simulated reruns: the
    same reruns (the same draws) with and without the initial models' spread, their difference the
    initial model's effect. LOO's initial part is 0: a member's LOO does not split the pot."""
    ids = len(matrices.ids)
    unknown = np.full(ids, math.nan)
    accepted, rate = matrices.accepted, acceptance(matrices.mask, matrices.accepted)
    model_of_noise = noise_model(matrices.fedsv, accepted, model, seed)
    keys = ("fedsv", "fedsv_normalized", "fedsv_completed")
    out = dict.fromkeys((*keys, "loo", "loo_normalized"), unknown)
    initial_out = dict.fromkeys(keys, unknown) | dict.fromkeys(("loo", "loo_normalized"), np.zeros(ids))
    validation = fold_deviations(matrices.fedsv_folds, matrices.shares)
    fedsv = training_noise(
        matrices.fedsv, accepted, matrices.estimator_variance, validation, model_of_noise, seed
    )
    members = np.asarray(matrices.accepted.any(axis=0), dtype=np.bool_)
    relative = dict(out)
    result = RerunPart(out, initial_out, relative)  # no residual left: the errors are unknown
    folds = 0 if validation is None else validation.shape[0]
    if fedsv is not None:
        initial = matrices.initial_spread
        draws = [
            replicates(fedsv, matrices.selected, rate, folds, count, seed, spread_, matrices.balanced)
            for spread_ in (0.0, np.nan_to_num(initial))
        ]
        fixed, moved = (simulate(d, matrices.selected, model, True, seed) for d in draws)
        names = {"fedsv": "sum", "fedsv_normalized": "normalized", "fedsv_completed": "completed"}
        out |= {key: spread(fixed[name]) for key, name in names.items()}
        relative |= {key: spread(centered(fixed[name], members)) for key, name in names.items()}
        if not math.isnan(initial):
            initial_out |= {key: spread(moved[name] - fixed[name]) for key, name in names.items()}
        shifted = None if math.isnan(initial) else moved["completed"]
        result = RerunPart(out, initial_out, relative, fixed["completed"], shifted)
    zeros = np.zeros_like(matrices.loo)
    loo_folds = fold_deviations(matrices.loo_folds, matrices.shares)
    loo = training_noise(matrices.loo, accepted, zeros, loo_folds, model_of_noise, seed)
    loo_names = {"loo": "sum", "loo_normalized": "normalized"}
    if loo is not None:
        loo_draws = replicates(loo, matrices.selected, rate, 0, count, seed, 0.0, matrices.balanced)
        found = simulate(loo_draws, matrices.selected, model, False, seed)
        out |= {"loo": spread(found["sum"]), "loo_normalized": spread(found["normalized"])}
        relative |= {key: spread(centered(found[name], members)) for key, name in loo_names.items()}
    return result


LABEL_MODEL = Model("rounds and members", 0, 2.0)
"""The noise model of a validation label's round values: a round's level plus a member's offset."""


def sum_rerun(
    values: FloatArray, matrices: RoundMatrices, seed: int = 0, count: int = REPLICATES
) -> FloatArray:
    """The training-and-selection part of the plain sums of another round-by-participant matrix of
    values over the same rounds (a validation label's values): its own noise around LABEL_MODEL, the
    run's selections and acceptance; NaN where it cannot be told."""
    accepted = matrices.accepted
    noise = training_noise(values, accepted, np.zeros_like(values), None, LABEL_MODEL, seed)
    if noise is None:
        return np.full(values.shape[1], math.nan)
    rate = acceptance(matrices.mask, accepted)
    draws = replicates(noise, matrices.selected, rate, 0, count, seed, 0.0, matrices.balanced)
    return spread(simulate(draws, matrices.selected, None, False, seed)["sum"])
