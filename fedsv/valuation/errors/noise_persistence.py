"""How a member's training noise persists over rounds, and how much of it a model's levels absorb.

A rerun moves the global model along another trajectory, and how useful a member's update is moves with
it, over several rounds at once: a member's noise in one round is correlated with its noise in the next.
Summed over rounds, such noise varies more than independent noise of the same size, and a model with a
member's own level (completion.Model) absorbs part of it into that level, so the residuals show less of
it than there is. The noise is modelled as AR(1) along the rounds (correlation rho ** k for rounds k
apart) with rho = PERSISTENCE, and the absorbed share is found by simulation: noise of that persistence,
drawn on the run's own selections and refitted by the same model, shows how much smaller the residuals
come out than the noise drawn.

Why rho is not read off the run's own residuals (as it was): residual correlation there is mostly the
model's misfit (a member's effect that changes with the rounds, which no completion model holds), not
noise, and the estimate ranged over 0 to 0.9 between reruns of one federation while the reruns' own
persistence was 0.29 to 0.47 on all four calibration federations (docs/decisions/0004): a stated error
that swung with it was too wide on some federations and too narrow on others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.accounting.completion import Model, fit
from fedsv.valuation.accounting.round_matrices import BoolArray, FloatArray

PERSISTENCE = 0.4
"""The correlation of a member's training noise between consecutive rounds: measured over the 16
reruns of each calibration federation (each member's round values less their mean over the reruns,
standardized per round), 0.42, 0.47, 0.35 and 0.29 (tabular twins, digits owners, digits silos,
corrupted MNIST); lag 2 gave 0.37, 0.26, 0.18, 0.25."""

DRAWS = 16
"""Simulated runs for the absorbed share (common random numbers: the same draws with and without
persistence)."""


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


def residuals(values: FloatArray, mask: BoolArray, model: Model, seed: int) -> FloatArray:
    """What `model`, fitted to the masked entries, leaves of them (0 elsewhere); (T, N) or (R, T, N)."""
    return np.where(mask, values - fit(values, mask, model, seed), 0.0)


def absorbed(
    noise: TrainingNoise, mask: BoolArray, model: Model, seed: int, rho: float = PERSISTENCE
) -> TrainingNoise:
    """`noise` persisting at `rho`, its size corrected for what the model absorbs of persistent noise
    (its sd was sized from residuals as if the noise were independent): the residuals' mean square
    under noise of persistence `rho` over that under independent noise, both simulated on the run's
    selections and refitted by the same model."""
    if not (noise.sd[mask] > 0).any() or not mask.any():
        return noise
    scale = np.where(noise.sd > 0, noise.sd, np.inf)
    white = np.random.default_rng(seed + 2).standard_normal((DRAWS, *noise.center.shape))
    sizes = []
    for persistence in (0.0, rho):
        draws = noise.center + noise.sd * persistent(white, persistence)
        left = residuals(draws, np.broadcast_to(mask, draws.shape), model, seed)  # every draw fitted at once
        sizes.append(float(np.square(left / scale)[:, mask].mean()))
    share = sizes[1] / max(sizes[0], 1e-300)
    return TrainingNoise(noise.center, noise.sd / math.sqrt(max(share, 1e-6)), rho)
