"""The two-way fit of round values: levels and effects together, their noise, the rounds' precision."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.accounting.two_way import TwoWayFit, fit_two_way

ROUNDS, MEMBERS, PICKED = 10, 16, 5


def design(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = np.zeros((ROUNDS, MEMBERS), dtype=bool)
    for t in range(ROUNDS):
        mask[t, rng.choice(MEMBERS, PICKED, replace=False)] = True
    return mask


def test_noise_free_values_give_back_their_levels_and_effects() -> None:
    mask = design(0)
    rng = np.random.default_rng(1)
    levels, effects = rng.normal(0.0, 1.0, ROUNDS), rng.normal(0.0, 0.1, MEMBERS)
    known = mask.any(axis=0)
    effects = np.where(known, effects - effects[known].mean(), 0.0)
    values = np.where(mask, levels[:, None] + effects[None, :], 0.0)
    fit = TwoWayFit.build(mask, rng.uniform(0.5, 2.0, ROUNDS))
    got_levels, got_effects = fit.solve(values)
    assert np.allclose(got_effects, effects, atol=1e-10)
    assert np.allclose(got_levels, levels, atol=1e-10)
    # a batch of values at once: the same map
    both = fit.solve(np.stack([values, 2.0 * values]))
    assert np.allclose(both[1][1], 2.0 * effects, atol=1e-10)


def test_the_effects_noise_is_their_spread_over_noise_draws_and_the_leverages_count_the_parameters() -> None:
    mask = design(2)
    sigma = np.linspace(3.0, 0.3, ROUNDS)
    fit = TwoWayFit.build(mask, 1.0 / sigma**2)
    rng = np.random.default_rng(3)
    draws = rng.standard_normal((4000, ROUNDS, MEMBERS)) * sigma[:, None]
    _, effects = fit.solve(draws)
    known = fit.known
    spread = effects[:, known].var(axis=0)
    assert np.allclose(spread / fit.noise[known], 1.0, atol=0.1)
    # the hat matrix's trace: a level per round and an effect per member, less the shared constant
    assert np.isclose(fit.leverage.sum(), ROUNDS + known.sum() - 1)


def test_the_rounds_noise_is_told_from_the_members_differences() -> None:
    """Around the rounds' means, members that differ by twice the noise would pass for noise; around
    the fit's levels and effects they do not. With the noise 10x larger early, each round is pooled
    towards the run's noise: the noisy early ones a little, the quiet late ones (taken noisier) more."""
    equal, falling = np.full(ROUNDS, 0.005), np.linspace(0.03, 0.003, ROUNDS)
    for sigma in (equal, falling):
        two_way, one_way = [], []
        for seed in range(40):
            mask = design(seed)
            rng = np.random.default_rng(100 + seed)
            effects = rng.normal(0.0, 0.01, MEMBERS)
            noise = rng.standard_normal(mask.shape) * sigma[:, None]
            values = np.where(mask, 0.05 + effects[None, :] + noise, 0.0)
            freedom = int(mask.sum()) - ROUNDS - int(mask.any(axis=0).sum()) + 1
            two_way.append(np.sqrt(1.0 / fit_two_way(values, mask, freedom).precision) / sigma)
            one_way.append(np.sqrt(1.0 / fit_two_way(values, mask, 0).precision) / sigma)
        if sigma is equal:
            assert 0.8 < float(np.median(two_way)) < 1.25
            assert float(np.median(one_way)) > 1.8
        else:
            assert 0.7 < float(np.median(np.array(two_way)[:, :3])) < 1.25
            assert float(np.median(np.array(two_way)[:, -3:])) > 1.0
