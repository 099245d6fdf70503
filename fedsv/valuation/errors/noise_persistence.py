"""How a member's training noise persists over rounds, read off the run's own residuals.

A rerun moves the global model along another trajectory, and how useful a member's update is moves with
it, over several rounds at once: a member's noise in one round is correlated with its noise in the next.
Summed over rounds, such noise varies more than independent noise of the same size, and a model with a
member's own level (completion.Model) absorbs part of it into that level, so the residuals show less
of it and less correlation than there is (by about 1/(n - 1) for n observations). The noise is
therefore modelled as AR(1) along the rounds (correlation rho ** k for rounds k apart), and rho and the
absorbed share are found by simulation (indirect inference): noise of each persistence in GRID, drawn
on the run's own selections and refitted by the same model, gives the residuals' lag correlation and
size each would show; the run's own are read off that curve.

The validation set's noise persists over rounds as well (the same validation samples every round) but
is counted in full by its own part (valuation_noise); its share of the residuals, known from the fold
values passed through the same fit, is taken out of the statistics first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.accounting.completion import Model, fit
from fedsv.valuation.accounting.round_matrices import BoolArray, FloatArray

GRID = np.linspace(0.0, 0.9, 10)
"""The persistences tried (correlation of a member's training noise between consecutive rounds)."""

DRAWS = 16
"""Simulated runs per persistence tried (common random numbers, so the curve is smooth in rho)."""


@dataclass(frozen=True)
class TrainingNoise:
    """A run's training noise: the model's fit of every entry (T, N), each entry's noise standard
    deviation (T, N), and its persistence: the correlation of a member's noise between rounds one apart
    (rho ** k for rounds k apart)."""

    center: FloatArray
    sd: FloatArray
    persistence: float = 0.0

    def draw(self, rng: np.random.Generator) -> FloatArray:
        """One rerun's values: the fit plus noise that persists over rounds as an AR(1) process."""
        return self.center + self.sd * persistent(rng.standard_normal(self.center.shape), self.persistence)


def persistent(white: FloatArray, rho: float) -> FloatArray:
    """Unit-variance AR(1) noise along the rounds (the second-to-last axis) from white noise."""
    out = white.copy()
    for t in range(1, white.shape[-2]):
        out[..., t, :] = rho * out[..., t - 1, :] + math.sqrt(1.0 - rho * rho) * white[..., t, :]
    return out


@dataclass(frozen=True)
class LagSums:
    """Sums over each member's consecutive observed rounds of standardized residuals: products of the
    pair, squares of the first and of the second, and squares of every observed one (leading axes:
    draws)."""

    products: FloatArray
    firsts: FloatArray
    seconds: FloatArray
    squares: FloatArray

    @classmethod
    def of(cls, z: FloatArray, mask: BoolArray) -> LagSums:
        lead = z.shape[:-2]
        sums = [np.zeros(lead) for _ in range(4)]
        for i in range(mask.shape[1]):
            column = z[..., np.flatnonzero(mask[:, i]), i]
            sums[3] += np.square(column).sum(axis=-1)
            sums[0] += (column[..., :-1] * column[..., 1:]).sum(axis=-1)
            sums[1] += np.square(column[..., :-1]).sum(axis=-1)
            sums[2] += np.square(column[..., 1:]).sum(axis=-1)
        return cls(*sums)

    def minus(self, other: LagSums) -> LagSums:
        return LagSums(
            self.products - other.products,
            self.firsts - other.firsts,
            self.seconds - other.seconds,
            self.squares - other.squares,
        )

    def correlation(self) -> FloatArray:
        # the two roots apart: their product overflowed where a simulated member's noise is huge
        scale = np.sqrt(np.maximum(self.firsts, 0.0)) * np.sqrt(np.maximum(self.seconds, 0.0))
        with np.errstate(over="ignore"):
            return np.asarray(self.products / np.maximum(scale, 1e-300), dtype=np.float64)


def residuals(values: FloatArray, mask: BoolArray, model: Model, seed: int) -> FloatArray:
    """What `model`, fitted to the masked entries, leaves of them (0 elsewhere)."""
    return np.where(mask, values - fit(values, mask, model, seed), 0.0)


def estimate(
    residual: FloatArray,
    validation_seen: FloatArray | None,  # (F, T, N): the validation noise's share of the residuals
    mask: BoolArray,
    noise: TrainingNoise,
    model: Model,
    seed: int,
) -> TrainingNoise:
    """`noise` with its persistence estimated and its size corrected for what the model absorbs of
    persistent noise (its sd was sized as if the noise were independent)."""
    if not (noise.sd[mask] > 0).any() or not mask.any():
        return noise
    scale = np.where(noise.sd > 0, noise.sd, np.inf)
    observed = LagSums.of(residual / scale, mask)
    if validation_seen is not None:
        seen = LagSums.of(validation_seen / scale, mask)
        observed = observed.minus(LagSums(*(part.sum(axis=0) for part in vars(seen).values())))
    white = np.random.default_rng(seed + 2).standard_normal((DRAWS, *residual.shape))
    correlation, size = [], []
    for rho in GRID:
        draws = noise.center + noise.sd * persistent(white, float(rho))
        left = np.array([residuals(d, mask, model, seed) for d in draws])
        sums = LagSums.of(left / scale, mask)
        correlation.append(float(sums.correlation().mean()))
        size.append(float(sums.squares.mean()))
    order = np.argsort(correlation)
    rho = float(np.interp(float(observed.correlation()), np.array(correlation)[order], GRID[order]))
    absorbed = float(np.interp(rho, GRID, size)) / max(size[0], 1e-300)
    return TrainingNoise(noise.center, noise.sd / math.sqrt(max(absorbed, 1e-6)), rho)
