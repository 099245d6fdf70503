"""A sampler's target at each value's own validation noise: its attempts replayed on the validation folds.

A round's values are means over validation samples, so they carry the validation set's noise: a fresh
draw of the validation set would move them by about their folds' spread (noise_target.fold_stderr,
what valuation_noise states for every value). Sampling error far below that is wasted work: at a
fraction f of it, the value's error against a rerun grows by a factor sqrt(1 + f^2) at most (1.12 at
f = 0.5). FoldReplay replays a sampler's attempts on each fold's game, at no evaluation (the round
game stored every coalition's utility per fold), validation_noise() takes the folds' spread less what
the sampler's own error adds to it, and thresholds() turns that into one stopping threshold per value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, polygamma

from fedsv.valuation.estimators.estimator import Estimator, Settings
from fedsv.valuation.games.class_scores import fold_games
from fedsv.valuation.games.game import FloatArray, Game

NOISE_FLOOR = 0.25
"""A value's noise counts as at least this share of the round's median: a member whose coalitions all
score alike on every fold (a null update) has no noise of its own to sample to."""


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


class FoldReplay:
    """The attempts of `sampler` replayed, in order, on each validation fold's game of `game`."""

    def __init__(self, game: Game, sampler: type[Estimator], settings: Settings) -> None:
        store = game.cell_scores()
        self.games = fold_games(store) if store is not None else []
        self.shares = store.shares if store is not None else np.ones(1)
        self.sampler, self.settings = sampler, settings

    @property
    def available(self) -> bool:
        """The game splits its validation set into folds (a per-sample metric, enough samples)."""
        return len(self.games) > 1

    def attempt(self, allowance: int) -> FoldRun:
        """The next attempt, with `allowance` new evaluations, on every fold."""
        runs = [self.sampler.configured(allowance, self.settings).run(g) for g in self.games]
        stderr = [np.zeros(r.values.shape) if r.stderr is None else r.stderr for r in runs]
        return FoldRun(np.stack([r.values for r in runs], axis=1), np.stack(stderr, axis=1), self.shares)


@dataclass(frozen=True)
class FoldRun:
    """One attempt's values on each fold (m, folds), their standard errors, and the folds' shares."""

    values: FloatArray
    stderr: FloatArray
    shares: FloatArray


def validation_noise(folds: FoldRun, stderr: FloatArray) -> FloatArray:
    """Each value's validation noise: its folds' spread less what the sampler's error adds to it.

    Value v = sum_f v_f, and fold_stderr spreads v_f / share_f around v. A sampler's error e_f on a
    fold's game (its own stated error s_f: a fold's game is rougher than the whole, its error larger)
    adds E[sum_f share_f (e_f / share_f - e)^2] / (F - 1) = (sum_f s_f^2 / share_f - s^2) / (F - 1)
    to the variance the spread measures (e = sum_f e_f, of stated error s); that is taken off.
    """
    shares = np.where(folds.shares > 0, folds.shares, 1.0)
    spread = fold_stderr(folds.values, folds.shares)
    count = folds.shares.shape[0]
    sampling = (np.sum(np.square(folds.stderr) / shares, axis=-1) - np.square(stderr)) / max(count - 1, 1)
    noise = np.sqrt(np.maximum(np.square(spread) - np.maximum(sampling, 0.0), 0.0))
    return np.asarray(noise, dtype=np.float64)


def pooled(noise: FloatArray, dof: int, values: FloatArray) -> FloatArray:
    """Each value's noise pulled towards what the round's values predict for it, by as much as its own
    estimate is noise.

    A noise read off F folds is a variance estimate with F - 1 degrees of freedom: with 4 folds (m = 20)
    it is off by 82% of itself (sqrt(2 / 3)), and a stopping rule that waits for every value's
    threshold waits for the unluckiest of them. On the log scale the estimate's own variance is known,
    trigamma(dof / 2). The round's log variances are fitted against the log of the values' size (a
    member that moves more images has more noise), and each keeps weight w = 1 - trigamma(dof / 2) /
    (the residual spread of the fit), 0 where that spread is all estimation noise, taking the rest
    from the fit (corrected for the log's bias, E log(chi2_k / k) = digamma(k / 2) + log(2 / k)). A
    value whose noise truly differs keeps it; a fold draw does not decide its threshold."""
    positive = np.isfinite(noise) & (noise > 0)
    if dof < 1 or int(positive.sum()) < 4:
        return noise
    logs = np.log(np.square(noise[positive]))
    size = np.abs(values[positive])
    x = np.log(size + 0.1 * float(np.median(size)) + 1e-12)
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, logs, rcond=None)
    fit = design @ coef
    spread = float(np.sum(np.square(logs - fit)) / (logs.shape[0] - 2))
    weight = max(0.0, 1.0 - float(polygamma(1, dof / 2)) / spread) if spread > 0 else 0.0
    bias = float(digamma(dof / 2) + np.log(2 / dof))
    out = np.array(noise, dtype=np.float64)
    out[positive] = np.exp(0.5 * (weight * logs + (1.0 - weight) * (fit - bias)))
    return out


def thresholds(
    noise: FloatArray, fraction: float, fallback: float, dof: int = 0, values: FloatArray | None = None
) -> FloatArray:
    """The standard error each value is sampled to: `fraction` of its noise (pooled() over the round's
    `values` where it was read off folds with `dof` degrees of freedom; at least NOISE_FLOOR of the
    round's median); `fallback` for every value where no noise is measured yet."""
    median = float(np.median(noise)) if noise.size else 0.0
    if not (np.all(np.isfinite(noise)) and median > 0):
        return np.full(noise.shape, fallback)
    noise = noise if values is None else pooled(noise, dof, values)
    return fraction * np.maximum(noise, NOISE_FLOOR * float(np.median(noise)))


__all__ = ["NOISE_FLOOR", "FoldReplay", "FoldRun", "pooled", "thresholds", "validation_noise"]
