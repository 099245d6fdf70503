"""The shrunk value: each member's precision-weighted effect on its rounds, shrunk by its noise."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.accounting import shrinkage
from fedsv.valuation.accounting.completion import complete
from fedsv.valuation.accounting.shrinkage import MIN_FACTOR, TRANSLATION, Shrinkage

ROUNDS, MEMBERS, PICKED = 12, 20, 6


def federation(
    effects: np.ndarray, seed: int, noise: float = 0.004
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A run's round values: level_t + effect_i + noise ten times larger in round 1 than in the last,
    PICKED of MEMBERS selected per round; (values, mask, weights, truth: each member's expected total)."""
    rng = np.random.default_rng(seed)
    levels = np.linspace(0.04, 0.004, ROUNDS)
    scale = noise * np.linspace(3.0, 0.3, ROUNDS)
    mask = np.zeros((ROUNDS, MEMBERS), dtype=bool)
    for t in range(ROUNDS):
        mask[t, rng.choice(MEMBERS, PICKED, replace=False)] = True
    values = levels[:, None] + effects[None, :] + rng.normal(0.0, 1.0, mask.shape) * scale[:, None]
    weights = np.full(ROUNDS, PICKED / MEMBERS)
    truth = weights @ levels + weights.sum() * effects
    return np.where(mask, values, 0.0), mask, weights, truth


def test_the_shrunk_value_is_closer_to_the_truth_than_the_completed_and_the_unshrunk_ones() -> None:
    """Members that differ a little, noise that differs a lot between rounds: weighing rounds by their
    precision and shrinking by the noise lands nearer each member's expected total."""
    effects = np.random.default_rng(9).normal(0.0, 0.0015, MEMBERS)
    errors: dict[str, list[float]] = {"shrunk": [], "completed": [], "unshrunk": []}
    for seed in range(30):
        values, mask, weights, truth = federation(effects, seed)
        fit = Shrinkage.fit(values, mask, mask, weights)
        levels, own = fit.two_way.solve(values)
        estimates = {
            "shrunk": fit.apply(values),
            "completed": complete(
                values, mask, np.zeros_like(values), [PICKED] * ROUNDS, MEMBERS, seed
            ).totals,
            "unshrunk": levels @ weights + weights.sum() * own,
        }
        seen = mask.any(axis=0)  # a member never selected is not valued by any
        for key, estimate in estimates.items():
            # what a payout reads: each member's distance from the others
            off = (estimate - estimate[seen].mean()) - (truth - truth[seen].mean())
            errors[key].append(float(np.mean(np.square(off[seen]))))
    assert np.mean(errors["shrunk"]) < 0.85 * np.mean(errors["completed"])
    assert np.mean(errors["shrunk"]) < 0.3 * np.mean(errors["unshrunk"])


def test_equal_members_are_paid_nearly_alike_in_the_order_of_their_evidence() -> None:
    values, mask, weights, _ = federation(np.zeros(MEMBERS), 4)
    fit = Shrinkage.fit(values, mask, mask, weights)
    seen = mask.any(axis=0)
    shrunk = fit.apply(values)[seen]
    raw = values.sum(axis=0)[seen] / mask.sum(axis=0)[seen]
    assert np.ptp(shrunk) < 0.3 * np.ptp(weights.sum() * raw)
    assert fit.between == 0.0  # nothing to tell them apart: the order is the evidence's, sum_t p_t r_ti
    assert np.all(fit.factors[seen] < 10 * MIN_FACTOR)
    # the mixed model's effects as tau^2 -> 0 (a ridge 1 / tau^2): tau^2 sum_t p_t (V[t, i] - level_t),
    # the levels the rounds' means
    levels = values.sum(axis=1) / mask.sum(axis=1)
    evidence = (np.where(mask, values - levels[:, None], 0.0) * fit.precision[:, None]).sum(axis=0)[seen]
    assert np.array_equal(np.argsort(shrunk), np.argsort(evidence))


def test_no_effect_is_pulled_more_than_the_translation_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member far beyond the noise keeps most of its distance; with 20 members one such member
    is pulled by at most about 2.3 standard errors, so the limit is tightened here to see it hold."""
    effects = np.zeros(MEMBERS)
    effects[3] = -0.02  # damages every round it is in, by far more than the noise
    values, mask, weights, truth = federation(effects, 2, noise=0.001)
    seen = mask.any(axis=0)
    for limit in (TRANSLATION, 1.0):
        monkeypatch.setattr(shrinkage, "TRANSLATION", limit)
        fit = Shrinkage.fit(values, mask, mask, weights)
        shrunk = np.where(seen, fit.apply(values), np.inf)
        assert int(np.argmin(shrunk)) == 3
        # every effect ends at most `limit` of its standard errors from the two-way fit's
        levels, raw = fit.two_way.solve(values)
        final = (shrunk - levels @ weights)[seen] / weights.sum()
        assert np.all(np.abs(final - raw[seen]) <= limit * np.sqrt(fit.noise[seen]) + 1e-12)
        assert fit.limited[3] == (limit == 1.0)
        # most of its distance is kept, towards the others and not past its evidence
        assert raw[3] < final[np.flatnonzero(seen) == 3][0] < 0.5 * raw[3]
        assert abs(shrunk[3] - np.median(shrunk[seen])) > 0.5 * abs(truth[3] - np.median(truth))


def test_turned_away_members_get_nothing_and_unselected_ones_are_not_valued() -> None:
    values, mask, weights, _ = federation(np.zeros(MEMBERS), 5)
    accepted = mask.copy()
    accepted[:, 0] = False  # selected, never aggregated
    half = np.flatnonzero(mask[:, 1])
    accepted[half[: len(half) // 2], 1] = False  # aggregated half the time
    never = ~mask.any(axis=0)
    fit = Shrinkage.fit(values, mask, accepted, weights)
    shrunk = fit.apply(values)
    assert shrunk[0] == 0.0 and not fit.known[0]
    assert np.all(shrunk[never] == 0.0)
    others = np.delete(shrunk, [0, 1, *np.flatnonzero(never)])
    assert 0.3 < shrunk[1] / np.median(others) < 0.7  # paid for the updates that counted


def test_the_value_is_linear_in_the_round_values_once_fitted() -> None:
    values, mask, weights, _ = federation(np.zeros(MEMBERS), 6)
    fit = Shrinkage.fit(values, mask, mask, weights)
    other = np.random.default_rng(1).normal(0.0, 0.01, values.shape)
    both = fit.apply(np.stack([values, other, values + 2 * other]), shifted=False)
    assert np.allclose(both[2], both[0] + 2 * both[1])
    shifted = fit.apply(np.stack([values, values + other]))  # the limited members' shifts: fixed
    assert np.allclose(shifted[1] - shifted[0], both[1])


def test_simulated_reruns_start_from_effects_that_spread_as_the_true_ones_do() -> None:
    """Over 40 federations whose members' true effects spread with variance sigma^2: the fitted model's
    effects spread as the truth plus their noise (2.2 to 5.5 sigma^2 measured); as_fitted pulls them to a
    spread a little under the truth's (0.55 sigma^2 measured over the members the translation limit
    leaves alone, since tau^2 is taken at its lower bound), and neither leaves them (unpulled) nor pulls
    them by B_i in place of its root (0.27 sigma^2)."""
    for sigma in (0.002, 0.004):
        fitted, pulled = [], []
        for seed in range(40):
            effects = np.random.default_rng(100 + seed).normal(0.0, sigma, MEMBERS)
            values, mask, weights, _ = federation(effects, seed)
            fit = Shrinkage.fit(values, mask, mask, weights)
            levels, own = fit.two_way.solve(values)
            model = levels[:, None] + own[None, :]
            out = fit.as_fitted(model)
            moved = out - model  # a member's effect moves, the same in every round; the levels do not
            assert np.allclose(moved, moved[0][None, :]) and np.all(moved[:, ~fit.known] == 0)
            free = fit.known & ~fit.limited
            fitted.append(float(np.mean(np.square(own[free] - own[fit.known].mean()))))
            pulled.append(float(np.mean(np.square(out[0, free] - out[0, fit.known].mean()))))
        assert np.mean(fitted) > 1.8 * sigma**2
        assert 0.4 * sigma**2 < np.mean(pulled) < 1.2 * sigma**2


def _alone(members: int, *outliers: int) -> list[list[int]]:
    """Every member in one group but `outliers`, each a group of its own."""
    return [[i for i in range(members) if i not in outliers], *([i] for i in outliers)]


def test_a_member_in_a_group_of_its_own_keeps_its_evidence_and_the_others_are_paid_alike() -> None:
    """A member that damages every round: with one group its effect is pulled towards the others; in a
    group of its own it keeps the two-way fit's own effect, while the equals stay paid nearly alike."""
    effects = np.zeros(MEMBERS)
    effects[7] = -0.01
    levels = np.linspace(0.04, 0.004, ROUNDS)
    for seed in range(5):
        values, mask, weights, _ = federation(effects, seed, noise=0.004)
        seen = mask.any(axis=0)
        pooled_fit = Shrinkage.fit(values, mask, mask, weights)
        grouped_fit = Shrinkage.fit(values, mask, mask, weights, _alone(MEMBERS, 7))
        pooled, grouped = pooled_fit.apply(values), grouped_fit.apply(values)
        two_way_levels, own = grouped_fit.two_way.solve(values)
        unpulled = two_way_levels @ weights + weights.sum() * own
        honest = seen & (np.arange(MEMBERS) != 7)
        assert abs(grouped[7] - unpulled[7]) < 0.1 * abs(pooled[7] - unpulled[7])
        assert np.ptp(grouped[honest]) < 0.3 * weights @ levels  # the equals: alike
        assert np.allclose(grouped[honest], pooled[honest], rtol=0.2)


def test_one_group_of_everyone_is_the_pooled_fit_and_groups_keep_the_value_linear() -> None:
    values, mask, weights, _ = federation(np.random.default_rng(2).normal(0.0, 0.002, MEMBERS), 8)
    plain = Shrinkage.fit(values, mask, mask, weights)
    everyone = Shrinkage.fit(values, mask, mask, weights, [list(range(MEMBERS))])
    assert plain.centering is None and everyone.centering is None
    assert np.allclose(everyone.apply(values), plain.apply(values))
    fit = Shrinkage.fit(values, mask, mask, weights, [list(range(10)), list(range(10, MEMBERS))])
    other = np.random.default_rng(1).normal(0.0, 0.01, values.shape)
    both = fit.apply(np.stack([values, other, values + 2 * other]), shifted=False)
    assert np.allclose(both[2], both[0] + 2 * both[1])
