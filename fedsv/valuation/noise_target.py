"""A sampler's target at each value's own validation noise: its attempts replayed on the validation folds.

A round's values are means over validation samples, so they carry the validation set's noise: a fresh
draw of the validation set would move them by about their folds' spread (round_matrices.fold_stderr,
what valuation_noise states for every value). Sampling error far below that is wasted work: at a
fraction f of it, the value's error against a rerun grows by a factor sqrt(1 + f^2) at most (1.12 at
f = 0.5). FoldReplay replays a sampler's attempts on each fold's game, at no evaluation (the round
game stored every coalition's utility per fold), validation_noise() takes the folds' spread less what
the sampler's own error adds to it, and thresholds() turns that into one stopping threshold per value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsv.valuation.class_scores import fold_games
from fedsv.valuation.estimator import Estimator, Settings
from fedsv.valuation.game import FloatArray, Game
from fedsv.valuation.round_matrices import fold_stderr

NOISE_FLOOR = 0.25
"""A value's noise counts as at least this share of the round's median: a member whose coalitions all
score alike on every fold (a null update) has no noise of its own to sample to."""


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


def thresholds(noise: FloatArray, fraction: float, fallback: float) -> FloatArray:
    """The standard error each value is sampled to: `fraction` of its noise (at least NOISE_FLOOR of the
    round's median); `fallback` for every value where no noise is measured yet."""
    median = float(np.median(noise)) if noise.size else 0.0
    if not (np.all(np.isfinite(noise)) and median > 0):
        return np.full(noise.shape, fallback)
    return fraction * np.maximum(noise, NOISE_FLOOR * median)


__all__ = ["NOISE_FLOOR", "FoldReplay", "FoldRun", "thresholds", "validation_noise"]
