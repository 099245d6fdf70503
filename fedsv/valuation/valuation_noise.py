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

The shrunk value (shrinkage.py) is a linear map of the completed one once its factors are fixed, so its
estimator's and validation parts follow through the map; its rerun part re-estimates the factors in
every simulated rerun. The assumptions, and where they fail: docs/valuation.md;
benchmarks/bench_calibration.py measures how the stated errors compare with the spread of real reruns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.completion import Model, completed_totals
from fedsv.valuation.rerun_noise import REPLICATES, rerun_part, spread
from fedsv.valuation.round_matrices import FloatArray, RoundMatrices, fold_stderr, norms
from fedsv.valuation.shrinkage import Shrinkage

COMPONENTS = ("estimator", "validation", "rerun")
"""The parts of a total's standard error, combined in quadrature."""


@dataclass(frozen=True)
class Uncertainty:
    """Per value (TOTAL_KEYS) and part (COMPONENTS): each participant's standard error (NaN: unknown)."""

    parts: dict[str, dict[str, FloatArray]]
    shrinkage: Shrinkage | None = None  # how the shrunk value is taken from the completed (shrinkage.py)

    def stderr(self, key: str) -> FloatArray:
        """The parts of `key` combined in quadrature (unknown where any part is)."""
        total = sum(np.square(self.parts[part][key]) for part in COMPONENTS)
        return np.asarray(np.sqrt(total), dtype=np.float64)


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
    return out, completed


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
        np.sqrt(np.maximum(np.square(spread(shrunk)) - np.nan_to_num(linear), 0.0)), dtype=np.float64
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
    rerun, completed_draws = rerun_part(matrices, model, replicates, seed)
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
