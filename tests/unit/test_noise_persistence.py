"""A member's training noise persisting over rounds: AR(1) draws, and what a model's levels absorb of it."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.accounting.completion import Model
from fedsv.valuation.errors.noise_persistence import TrainingNoise, absorbed, persistent, residuals


def test_persistent_noise_has_unit_variance_and_the_asked_lag_correlation() -> None:
    white = np.random.default_rng(0).standard_normal((4000, 12, 3))
    noise = persistent(white, 0.6)
    assert abs(float(noise.std()) - 1.0) < 0.02
    lag = np.mean(noise[:, 1:, :] * noise[:, :-1, :])
    lag2 = np.mean(noise[:, 2:, :] * noise[:, :-2, :])
    assert abs(lag - 0.6) < 0.02 and abs(lag2 - 0.36) < 0.02


def _run(rho: float, seed: int) -> tuple[np.ndarray, np.ndarray, TrainingNoise]:
    """Members with their own levels and noise of persistence rho, half of them seen per round."""
    rng = np.random.default_rng(seed)
    rounds, members = 20, 30
    levels = np.linspace(0.05, 0.01, rounds)[:, None] + rng.normal(0.0, 0.01, members)[None, :]
    mask = rng.random((rounds, members)) < 0.5
    values = levels + 0.01 * persistent(rng.standard_normal((rounds, members)), rho)
    noise = TrainingNoise(levels, np.full((rounds, members), 0.01))
    return values, mask, noise


def test_noise_sized_from_residuals_is_raised_by_what_member_levels_absorb() -> None:
    """Residuals around a model with each member's own level are smaller than noise that persists over
    rounds: sized from them as if the noise were independent, then raised by the absorbed share for
    its persistence, the noise comes out at its true size (0.01), and the more persistent, the more
    it is raised."""
    model = Model("rounds and members", 0, 0.0)
    raised = []
    for rho in (0.0, 0.4, 0.8):
        sizes, found = [], []
        for seed in range(6):
            values, mask, noise = _run(rho, seed)
            left = residuals(values, mask, model, 0)
            kept = 1.0 - (mask.shape[0] + mask.shape[1]) / mask.sum()  # a level per round and member
            independent = float(np.sqrt(np.square(left[mask]).mean() / kept))
            sized = TrainingNoise(noise.center, np.full(mask.shape, independent))
            fitted = absorbed(sized, mask, model, seed, rho)
            assert fitted.persistence == rho
            found.append(float(fitted.sd.mean()))
            sizes.append(float(fitted.sd.mean()) / independent)
        assert abs(np.mean(found) / 0.01 - 1.0) < 0.1, (rho, found)
        raised.append(float(np.mean(sizes)))
    assert abs(raised[0] - 1.0) < 0.03 and 1.02 < raised[1] < raised[2], raised


def test_no_noise_means_nothing_to_estimate() -> None:
    _, mask, noise = _run(0.5, 0)
    silent = TrainingNoise(noise.center, np.zeros_like(noise.sd))
    assert absorbed(silent, mask, Model("round means"), 0) is silent
