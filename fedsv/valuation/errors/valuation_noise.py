"""How sure a value is: the standard error of every total against a rerun of the same federation.

A total moves between reruns for four reasons, each estimated from what the run already has (no extra
message; the initial models' scores are forward passes when the run starts), combined in quadrature
(COMPONENTS):

- **the estimator**: a sampled round value's own standard error (0 where exact);
- **the validation set**: a utility that is a mean over validation samples makes each value the mean of
  per-sample values, so the values measured on each of the validation folds alone (by_class.FoldValues)
  spread as a fresh draw of the validation set would move them. A total is summed fold by fold over the
  rounds before the spread is taken (noise_target.fold_stderr), so a member's luck with the
  validation set, which persists from round to round, is counted once and in full;
- **training and selection** (a rerun with another seed): simulated reruns from the run's own noise,
  persistent over rounds (rerun_noise.py, noise_persistence.py);
- **the initial model** (another seed starts from another w_0): the same simulated reruns with the
  first round's gain moved by the spread of other initial models' scores (initial_spread.py). It moves
  every member alike, so Uncertainty.between leaves it out of the error of a difference between two
  members.

The shrunk value (shrinkage.py, averaged over the verdict's groups of simulated reruns: bagging.py) is
linear in the completed totals once fitted, so its estimator's and validation parts are the completed
value's through that map; its rerun part pulls every simulated rerun's completed totals again, averaged
over groups found around that rerun (a real rerun's verdict may group a member otherwise). The
assumptions, and where they fail: docs/valuation.md;
benchmarks/bench_calibration.py measures how the stated errors compare with the spread of real reruns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.accounting.bagging import BAGS, INNER, Pull, bagged, pulled_many
from fedsv.valuation.accounting.completion import Model, completed_totals
from fedsv.valuation.accounting.round_matrices import (
    FloatArray,
    RoundMatrices,
    centered,
    norms,
)
from fedsv.valuation.errors.rerun_noise import REPLICATES, RerunPart, rerun_part, spread
from fedsv.valuation.estimators.noise_target import fold_stderr

COMPONENTS = ("estimator", "validation", "rerun", "initial")
"""The parts of a total's standard error, combined in quadrature: the estimator's, the validation
set's, a rerun's training and selection, and another initial model's."""

BETWEEN = ("estimator", "validation", "rerun")
"""The parts of the error of a member's total against the members' mean (Uncertainty.between): the
initial model moves every member alike, and so do a round's level and the validation set's luck
shared by all, which cancel there."""


@dataclass(frozen=True)
class Uncertainty:
    """Per value (TOTAL_KEYS) and part (COMPONENTS): each participant's standard error (NaN: unknown)."""

    parts: dict[str, dict[str, FloatArray]]
    shrinkage: Pull  # the shrunk value's pull (bagging.py), averaged over the verdict's groups of reruns
    relative: dict[str, dict[str, FloatArray]]  # BETWEEN's parts of each total less the members' mean

    def shrunk(self, completed: FloatArray) -> FloatArray:
        """The shrunk totals of the run's completed totals (N,): each pulled towards the members of its
        verdict group by the share of its distance from them that is noise, averaged over the groups
        reruns would find; a member set apart in (nearly) every rerun keeps (nearly) its completed
        total (the expectation of its FedSV over the selection: about 0 for a member worth nothing)."""
        return self.shrinkage.apply(completed)

    def stderr(self, key: str) -> FloatArray:
        """The parts of `key` combined in quadrature (unknown where any part is)."""
        total = sum(np.square(self.parts[part][key]) for part in COMPONENTS)
        return np.asarray(np.sqrt(total), dtype=np.float64)

    def between(self, key: str) -> FloatArray:
        """The error of a member's `key` less the members' mean: what tells it apart from the others
        (the verdict, its groups and the report's ties weigh differences by it; a difference between
        two members has about the root of the sum of their squares)."""
        total = sum(np.square(self.relative[part][key]) for part in BETWEEN)
        return np.asarray(np.sqrt(total), dtype=np.float64)


def _validation(
    matrices: RoundMatrices, model: Model | None, seed: int
) -> tuple[dict[str, FloatArray], dict[str, FloatArray], FloatArray]:
    """Each total's validation part, from its fold totals (NaN where a round it sums was not split), the
    same of each total less the members' mean, and the completed value's fold totals (N, F)."""
    mask, weights, shares = matrices.mask, matrices.weights, matrices.shares
    unsplit = np.isnan(matrices.fedsv_folds).any(axis=2) & mask
    unknown = unsplit.any(axis=0)
    fedsv_f = np.where(mask[..., None], np.nan_to_num(matrices.fedsv_folds), 0.0)
    loo_f = np.where(mask[..., None], np.nan_to_num(matrices.loo_folds), 0.0)
    fedsv_norm, loo_norm = norms(matrices.fedsv, mask), norms(matrices.loo, mask)
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
    members = np.asarray(matrices.accepted.any(axis=0), dtype=np.bool_)
    out = {key: fold_stderr(fold_totals, shares) for key, fold_totals in totals.items()}
    relative = {key: fold_stderr(centered(t, members, axis=0), shares) for key, t in totals.items()}
    for table in (out, relative):
        for key in table:
            table[key][unknown] = math.nan
    return out, relative, completed


def _estimator(matrices: RoundMatrices) -> dict[str, FloatArray]:
    """Each total's estimator part: rounds are valued independently, so variances add."""
    variance, mask = np.where(matrices.mask, matrices.estimator_variance, 0.0), matrices.mask
    fedsv_norms = norms(matrices.fedsv, mask)
    zeros = np.zeros(len(matrices.ids))
    return {
        "fedsv": np.sqrt(variance.sum(axis=0)),
        "fedsv_normalized": np.sqrt((variance / np.square(fedsv_norms)[:, None]).sum(axis=0)),
        "fedsv_completed": np.sqrt(np.square(matrices.weights) @ variance),
        "loo": zeros,
        "loo_normalized": zeros,
    }


def _shrunk_parts(
    matrices: RoundMatrices,
    shrinkage: Pull,
    reruns: RerunPart,
    completed: tuple[FloatArray, FloatArray],  # the completed value's estimator part (N,), fold totals (N, F)
    errors: FloatArray,  # the completed totals' errors against the members' mean, which group them
    deviations: FloatArray | None,  # the simulated reruns' completed totals less their mean
) -> tuple[dict[str, FloatArray], dict[str, FloatArray]]:
    """The shrunk value's parts, and those of its totals less the members' mean: the estimator's and
    the validation set's through its linear map; a rerun's and the initial model's from the simulated
    reruns' completed totals, started from totals that spread as the fit estimates (as_fitted) and
    each pulled as the run is, averaged over the groups found around it (INNER draws)."""
    shrink = shrinkage.map()
    linked = np.asarray(shrink != 0.0, dtype=np.bool_)  # a member's shrunk total takes these totals
    members = np.asarray(matrices.accepted.any(axis=0), dtype=np.bool_)
    estimator_completed, folds = completed
    known = np.isfinite(estimator_completed)
    estimator = np.sqrt(np.square(shrink) @ np.square(np.where(known, estimator_completed, 0.0)))
    estimator = np.where((linked & ~known[None, :]).any(axis=1), math.nan, estimator)
    split = np.asarray(~(np.isnan(matrices.fedsv_folds).any(axis=2) & matrices.mask).any(axis=0))
    unsplit = (linked & ~split[None, :]).any(axis=1)
    moved = shrink @ folds
    validation = fold_stderr(moved, matrices.shares)
    validation_relative = fold_stderr(centered(moved, members, axis=0), matrices.shares)
    validation[unsplit] = validation_relative[unsplit] = math.nan
    unknown = np.full(len(matrices.ids), math.nan)
    rerun, rerun_relative, initial = unknown, unknown, unknown
    if reruns.completed is not None and deviations is not None:
        center = reruns.completed.mean(axis=0)
        start = shrinkage.as_fitted(center) - center
        inner = deviations[BAGS : BAGS + INNER] if deviations.shape[0] > BAGS else deviations[:INNER]

        def pulled(draws: FloatArray) -> FloatArray:
            return pulled_many(matrices.ids, draws + start, errors, members, inner)

        fixed = pulled(reruns.completed)
        rerun, rerun_relative = spread(fixed), spread(centered(fixed, members))
        if reruns.completed_moved is not None:
            initial = spread(pulled(reruns.completed_moved) - fixed)
    never = ~matrices.mask.any(axis=0)
    parts = {"estimator": estimator, "validation": validation, "rerun": rerun, "initial": initial}
    relative = {"estimator": estimator, "validation": validation_relative, "rerun": rerun_relative}
    return (
        {name: np.where(never, math.inf, part) for name, part in parts.items()},
        {name: np.where(never, math.inf, part) for name, part in relative.items()},
    )


def uncertainty(
    matrices: RoundMatrices,
    model: Model | None,
    totals: FloatArray,
    replicates: int = REPLICATES,
    seed: int = 0,
) -> Uncertainty:
    """Every total's standard error by part, and the shrunk value's pull (bagging.py: averaged over
    the verdict's groups of the run's completed `totals` moved by BAGS of the simulated reruns'
    deviations; completion.complete's totals, by `model`: None where nothing was missing), the totals
    it pulls."""
    never = ~matrices.mask.any(axis=0)
    validation, validation_relative, completed_folds = _validation(matrices, model, seed)
    estimator = _estimator(matrices)
    reruns = rerun_part(matrices, model, replicates, seed)
    relative = {"estimator": dict(estimator), "validation": validation_relative, "rerun": reruns.relative}
    parts = {
        "estimator": estimator,
        "validation": validation,
        "rerun": reruns.rerun,
        "initial": reruns.initial,
    }
    for by_key in (*parts.values(), *relative.values()):
        by_key["fedsv_completed"] = np.where(never, math.inf, by_key["fedsv_completed"])
    errors = np.sqrt(sum(np.square(relative[part]["fedsv_completed"]) for part in BETWEEN))
    members = np.asarray(matrices.accepted.any(axis=0), dtype=np.bool_)
    deviations = None if reruns.completed is None else reruns.completed - reruns.completed.mean(axis=0)
    bags = None if deviations is None else deviations[:BAGS]
    shrinkage = bagged(matrices.ids, totals, errors, members, bags)
    completed = (estimator["fedsv_completed"], completed_folds)
    shrunk, shrunk_relative = _shrunk_parts(matrices, shrinkage, reruns, completed, errors, deviations)
    for name, value in shrunk.items():
        parts[name]["fedsv_shrunk"] = value
    for name, value in shrunk_relative.items():
        relative[name]["fedsv_shrunk"] = value
    return Uncertainty(parts, shrinkage, relative)
