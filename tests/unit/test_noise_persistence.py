"""A member's training noise persisting over rounds: AR(1) draws, and its persistence read off residuals."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.accounting.completion import Model
from fedsv.valuation.errors.noise_persistence import TrainingNoise, estimate, persistent, residuals


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


def test_the_persistence_is_recovered_through_what_a_member_level_absorbs() -> None:
    """Residuals around a model with each member's own level show less correlation than the noise has;
    matching by simulation recovers it, and sizes the noise up for what the levels absorbed."""
    model = Model("rounds and members", 0, 0.0)
    raised = []
    for rho in (0.0, 0.5, 0.8):
        found, sizes = [], []
        for seed in range(6):
            values, mask, noise = _run(rho, seed)
            residual = residuals(values, mask, model, 0)
            shrunk_sd = TrainingNoise(noise.center, noise.sd * 0.8)  # as an independent-noise fit sizes it
            fitted = estimate(residual, None, mask, shrunk_sd, model, seed)
            found.append(fitted.persistence)
            sizes.append(float(fitted.sd.mean() / shrunk_sd.sd.mean()))
        assert abs(np.mean(found) - rho) < 0.15, (rho, found)
        raised.append(float(np.mean(sizes)))
    # persistent noise is partly absorbed by the members' levels: the more persistent, the more raised
    assert abs(raised[0] - 1.0) < 0.03 and 1.02 < raised[1] < raised[2], raised


def test_no_noise_means_nothing_to_estimate() -> None:
    values, mask, noise = _run(0.5, 0)
    silent = TrainingNoise(noise.center, np.zeros_like(noise.sd))
    assert estimate(values - noise.center, None, mask, silent, Model("round means"), 0) is silent
