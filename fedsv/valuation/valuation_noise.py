"""How sure a value is: the standard error of every total against a rerun of the same federation.

A total moves between reruns for three reasons, each estimated from what the run already has (no extra
evaluation, no extra message), and combined in quadrature (COMPONENTS):

- **the estimator**: a sampled round value's own standard error (0 where exact);
- **the validation set**: a utility that is a mean over validation samples makes each value the mean of
  per-sample values, so the values measured on each of the validation folds alone (by_class.FoldValues)
  spread as a fresh draw of the validation set would move them. A total is summed fold by fold over the
  rounds before the spread is taken (round_matrices.fold_stderr), so a member's luck with the
  validation set, which persists from round to round, is counted once and in full;
- **training and selection** (a rerun with another seed): simulated reruns from the run's own noise
  (rerun_noise.py).

The shrunk value (shrinkage.py) is linear in the round values once its fit is fixed, so its estimator's
and validation parts follow through that map; its rerun part refits it in every simulated rerun. The
assumptions, and where they fail: docs/valuation.md;
benchmarks/bench_calibration.py measures how the stated errors compare with the spread of real reruns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.completion import Model, completed_totals
from fedsv.valuation.rerun_noise import REPLICATES, rerun_part, spread
from fedsv.valuation.round_matrices import FloatArray, RoundMatrices, fold_deviations, fold_stderr, norms
from fedsv.valuation.shrinkage import Shrinkage

COMPONENTS = ("estimator", "validation", "rerun")
"""The parts of a total's standard error, combined in quadrature."""


@dataclass(frozen=True)
class Uncertainty:
    """Per value (TOTAL_KEYS) and part (COMPONENTS): each participant's standard error (NaN: unknown)."""

    parts: dict[str, dict[str, FloatArray]]
    shrinkage: Shrinkage  # the shrunk value's fit (shrinkage.py)

    def stderr(self, key: str) -> FloatArray:
        """The parts of `key` combined in quadrature (unknown where any part is)."""
        total = sum(np.square(self.parts[part][key]) for part in COMPONENTS)
        return np.asarray(np.sqrt(total), dtype=np.float64)


def _validation(matrices: RoundMatrices, model: Model | None, seed: int) -> dict[str, FloatArray]:
    """Each total's validation part, from its fold totals (NaN where a round it sums was not split)."""
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
    out = {key: fold_stderr(fold_totals, shares) for key, fold_totals in totals.items()}
    for key in out:
        out[key][unknown] = math.nan
    return out


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


def _shrunk_estimator(matrices: RoundMatrices, shrinkage: Shrinkage, seed: int) -> FloatArray:
    """The shrunk value's estimator part: the round values' estimator noise through its linear map
    (simulated; NaN for a member with a round of unknown error)."""
    variance = np.where(matrices.accepted, matrices.estimator_variance, 0.0)
    unknown = np.isnan(variance).any(axis=0)
    sd = np.sqrt(np.nan_to_num(variance))
    if not sd.any():
        return np.where(unknown, math.nan, 0.0)
    noise = np.random.default_rng(seed + 3).standard_normal((REPLICATES, *sd.shape)) * sd
    moved = shrinkage.apply(matrices.fedsv + noise) - shrinkage.apply(matrices.fedsv)
    return np.where(unknown, math.nan, np.sqrt(np.mean(np.square(moved), axis=0)))


def _shrunk_parts(
    matrices: RoundMatrices, shrinkage: Shrinkage, draws: FloatArray | None, seed: int
) -> dict[str, FloatArray]:
    """The shrunk value's parts: the estimator's and the validation set's through its linear map (the
    fold deviations, round_matrices.fold_deviations), a rerun's from the simulated reruns' shrunk totals
    (each refitted, with the validation set's noise drawn into it) less those two."""
    estimator = _shrunk_estimator(matrices, shrinkage, seed)
    deviations = fold_deviations(matrices.fedsv_folds, matrices.shares)
    unsplit = (np.isnan(matrices.fedsv_folds).any(axis=2) & matrices.mask).any(axis=0)
    if deviations is None:
        validation = np.full(len(matrices.ids), math.nan)
    else:
        validation = np.sqrt(np.square(shrinkage.apply(deviations, shifted=False)).sum(axis=0))
        validation[unsplit] = math.nan
    if draws is None:
        rerun = np.full(len(matrices.ids), math.nan)
    else:
        linear = np.square(np.nan_to_num(validation)) + np.square(np.nan_to_num(estimator))
        rerun = np.sqrt(np.maximum(np.square(spread(draws)) - linear, 0.0))
    never = ~matrices.mask.any(axis=0)
    return {
        "estimator": np.where(never, math.inf, estimator),
        "validation": np.where(never, math.inf, validation),
        "rerun": np.where(never, math.inf, rerun),
    }


def uncertainty(
    matrices: RoundMatrices, model: Model | None, replicates: int = REPLICATES, seed: int = 0
) -> Uncertainty:
    """Every total's standard error by part, and the shrunk value's fit (shrinkage.py); `model`: the
    completion's (None: nothing was missing)."""
    never = ~matrices.mask.any(axis=0)
    validation = _validation(matrices, model, seed)
    rerun, shrunk_draws = rerun_part(matrices, model, replicates, seed)
    parts = {"estimator": _estimator(matrices), "validation": validation, "rerun": rerun}
    for by_key in parts.values():
        by_key["fedsv_completed"] = np.where(never, math.inf, by_key["fedsv_completed"])
    shrinkage = Shrinkage.fit(matrices.fedsv, matrices.mask, matrices.accepted, matrices.weights)
    for name, value in _shrunk_parts(matrices, shrinkage, shrunk_draws, seed).items():
        parts[name]["fedsv_shrunk"] = value
    return Uncertainty(parts, shrinkage)
