"""The shrunk value: completed totals pulled towards their verdict group's mean by their share of noise."""

from __future__ import annotations

import itertools

import numpy as np

from fedsv.valuation.accounting.bagging import verdict_groups
from fedsv.valuation.accounting.shrinkage import MIN_FACTOR, STEIN, Fits, Shrinkage

MEMBERS = 20
IDS = [f"p{i:03d}" for i in range(MEMBERS)]


def draw(truth: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A run's completed totals: the truth plus noise of a size that differs by member (0.5x to 2x);
    (totals, errors)."""
    rng = np.random.default_rng(seed)
    errors = 0.01 * np.linspace(0.5, 2.0, truth.shape[0])
    return truth + rng.normal(0.0, 1.0, truth.shape) * errors, errors


def test_the_shrunk_value_is_closer_to_the_truth_than_the_completed_one() -> None:
    """Members that differ by about their noise: pulled by the share of noise in their distance from
    the others, the totals land nearer each member's expected total, by what a payout reads (each
    member's distance from the others) and in amounts."""
    truth = 0.1 + np.random.default_rng(9).normal(0.0, 0.01, MEMBERS)
    shrunk_off: list[float] = []
    completed_off: list[float] = []
    for seed in range(200):
        totals, errors = draw(truth, seed)
        fit = Shrinkage.fit(totals, errors, [list(range(MEMBERS))])
        for estimate, out in ((fit.apply(totals), shrunk_off), (totals, completed_off)):
            out.append(float(np.mean(np.square(estimate - truth))))
    assert np.mean(shrunk_off) < 0.8 * np.mean(completed_off)


def test_equal_members_are_paid_nearly_alike_in_the_order_of_their_evidence() -> None:
    """All equal: the verdict finds one group, and in about half the runs (S / (f - 2) under the mean
    noise: chi-square with 19 degrees of freedom under 17 and the noise's spread, 0.4-0.55) tau^2 is at
    its floor and the members are paid alike up to a millionth of their distance, ordered by their
    precision-weighted deviation; in the others their spread is cut by the pull."""
    floors, ratios = 0, []
    for seed in range(100):
        totals, errors = draw(np.full(MEMBERS, 0.1), seed)
        groups = verdict_groups(IDS, totals, errors)
        fit = Shrinkage.fit(totals, errors, groups)
        shrunk = fit.apply(totals)
        ratios.append(np.ptp(shrunk) / np.ptp(totals))  # a verdict that splits equals at 5% pulls less
        if groups is not None and len(groups) == 1 and fit.between <= MIN_FACTOR * np.mean(errors**2):
            floors += 1
            assert np.ptp(shrunk) < 1e-4 * np.ptp(totals)
            mean = np.sum(totals / errors**2) / np.sum(1 / errors**2)
            assert np.array_equal(np.argsort(shrunk), np.argsort((totals - mean) / errors**2))
    assert floors >= 35
    assert np.quantile(ratios, 0.35) < 1e-4 and np.mean(ratios) < 0.2


def test_a_member_in_a_group_of_its_own_keeps_its_evidence_and_the_others_are_paid_alike() -> None:
    """A free rider worth nothing beside nineteen equals: the verdict sets it apart, and it is paid its
    own completed total (about 0), not the others' level; the equals are pulled together."""
    truth = np.full(MEMBERS, 0.05)
    truth[7] = 0.0
    for seed in range(10):
        errors = np.full(MEMBERS, 0.002)
        totals = truth + np.random.default_rng(seed).normal(0.0, 0.002, MEMBERS)
        groups = verdict_groups(IDS, totals, errors)
        assert groups is not None and [7] in groups, (seed, groups)
        fit = Shrinkage.fit(totals, errors, groups)
        shrunk = fit.apply(totals)
        assert shrunk[7] == totals[7] and fit.factors[7] == 1.0
        honest = np.arange(MEMBERS) != 7
        assert np.ptp(shrunk[honest]) <= np.ptp(totals[honest])
        assert shrunk[7] < 0.2 * shrunk[honest].min()


def test_groups_keep_their_order_and_the_value_is_linear_once_fitted() -> None:
    """Three levels far apart: every total stays within its group's range, so a better group is paid
    more than a worse one, and the fitted map is linear (what the errors' parts rely on)."""
    truth = np.repeat([0.02, 0.05, 0.08], [7, 7, 6])
    for seed in range(10):
        totals, errors = draw(truth, seed)
        groups = verdict_groups(IDS, totals, errors)
        assert groups is not None
        fit = Shrinkage.fit(totals, errors, groups)
        shrunk = fit.apply(totals)
        for group in groups:
            assert totals[group].min() - 1e-12 <= shrunk[group].min()
            assert shrunk[group].max() <= totals[group].max() + 1e-12
        ranked = sorted(groups, key=lambda g: -totals[g].mean())
        for better, worse in itertools.pairwise(ranked):
            assert shrunk[better].min() >= shrunk[worse].max()
        other = np.random.default_rng(seed).normal(0.0, 0.01, (2, MEMBERS))
        both = fit.apply(np.stack([totals, other[0], totals + 2 * other[0]]))
        assert np.allclose(both[2], both[0] + 2 * both[1])
        assert np.allclose(fit.map() @ totals, shrunk)


def test_members_of_unknown_or_no_error_are_neither_pulled_nor_pulling() -> None:
    """A member never selected (error inf), valued 0 in every rerun (error 0) or never aggregated keeps
    its total, and the others' group mean does not count it; with no groups (the verdict cannot test)
    nobody is pulled."""
    totals, errors = draw(np.full(MEMBERS, 0.05), 3)
    errors[0], errors[1], totals[1] = np.inf, 0.0, 0.0
    fit = Shrinkage.fit(totals, errors, [list(range(MEMBERS))])
    shrunk = fit.apply(totals)
    assert shrunk[0] == totals[0] and shrunk[1] == 0.0
    assert fit.weights[0] == fit.weights[1] == 0.0
    assert np.array_equal(Shrinkage.fit(totals, errors, None).apply(totals), totals)
    # a member turned away in every round is worth 0, exactly, though its error against the others is not 0
    errors[1] = 0.01
    turned_away = np.arange(MEMBERS) != 1
    fit = Shrinkage.fit(totals, errors, [list(range(MEMBERS))], turned_away)
    assert fit.apply(totals)[1] == 0.0 and fit.weights[1] == 0.0
    assert Shrinkage.fit(totals, errors, [list(range(MEMBERS))]).apply(totals)[1] > 0.0
    alone = Shrinkage.fit(totals, errors, [[i] for i in range(MEMBERS)])
    assert np.array_equal(alone.apply(totals), totals) and np.isnan(alone.between)


def test_simulated_reruns_start_from_totals_that_spread_as_the_true_ones_do() -> None:
    """Over 100 runs whose true totals spread with variance sigma^2: a run's totals spread as the truth
    plus their noise; as_fitted pulls them by sqrt(B_i) to about the truth's spread, where B_i in place
    of its root would pull them well below it."""
    sigma = 0.01
    seen, fitted, pulled, squared = [], [], [], []
    for seed in range(100):
        truth = 0.1 + np.random.default_rng(1000 + seed).normal(0.0, sigma, MEMBERS)
        totals, errors = draw(truth, seed)
        fit = Shrinkage.fit(totals, errors, [list(range(MEMBERS))])
        seen.append(float(np.var(totals)))
        fitted.append(float(np.var(fit.as_fitted(totals))))
        squared.append(float(np.var(fit.apply(totals))))
        pulled.append(float(np.var(truth)))
    assert np.mean(seen) > 1.5 * np.mean(pulled)
    assert 0.75 * np.mean(pulled) < np.mean(fitted) < 1.25 * np.mean(pulled)
    assert np.mean(squared) < 0.8 * np.mean(fitted)


def test_the_pull_is_james_and_steins() -> None:
    """Equal noise s^2, one group of k: each member keeps B = 1 - (k - 3) s^2 / S of its distance from
    the group's mean (S: the squares about it), never less than the floor."""
    k, noise = 8, 0.01
    for seed in range(50):
        rng = np.random.default_rng(seed)
        totals = 0.1 + rng.normal(0.0, noise * (1 + seed % 3), k)
        fit = Shrinkage.fit(totals, np.full(k, noise), [list(range(k))])
        squares = float(np.sum(np.square(totals - totals.mean())))
        expected = max(1.0 - (k - 3) * noise**2 / squares, MIN_FACTOR / (1.0 + MIN_FACTOR))
        assert np.allclose(fit.factors, expected, rtol=1e-9, atol=1e-12)
        assert np.allclose(fit.apply(totals), totals.mean() + expected * (totals - totals.mean()))


def test_too_few_to_estimate_the_pull_from_are_not_pulled() -> None:
    """Three members in one group, or two groups of two, leave two degrees of freedom: no pull of the
    James-Stein form beats none, and each member keeps its completed total; a group of three beside one
    of two (three degrees of freedom) is pulled."""
    totals = np.array([0.10, 0.11, 0.13, 0.30, 0.31])
    errors = np.full(5, 0.02)
    for groups in ([[0, 1, 2]], [[0, 1], [3, 4]]):
        fit = Shrinkage.fit(totals, errors, groups)
        assert fit.groups == () and np.array_equal(fit.apply(totals), totals), groups
    pulled = Shrinkage.fit(totals, errors, [[0, 1, 2], [3, 4]])
    assert pulled.groups and np.ptp(pulled.apply(totals)[:3]) < np.ptp(totals[:3])


def _by_hand(totals: np.ndarray, errors: np.ndarray, groups: list[list[int]] | None) -> np.ndarray:
    """James and Stein's pull within `groups`, written out: the (N, N) map to shrunk totals."""
    noise = errors**2
    usable = np.isfinite(noise) & (noise > 0)
    pulled = [[i for i in g if usable[i]] for g in groups or []]
    pulled = [g for g in pulled if len(g) >= 2]
    out = np.eye(totals.shape[0])
    members = [i for g in pulled for i in g]
    freedom = sum(len(g) - 1 for g in pulled)
    if not pulled or freedom - STEIN <= 0:
        return out
    squares = 0.0
    for g in pulled:
        w = (1 / noise[g]) / (1 / noise[g]).sum()
        squares += float(((totals[g] - w @ totals[g]) ** 2).sum())
    tau2 = max(squares / (freedom - STEIN) - noise[members].mean(), MIN_FACTOR * noise[members].mean())
    for g in pulled:
        w = (1 / noise[g]) / (1 / noise[g]).sum()
        for i in g:
            b = tau2 / (tau2 + noise[i])
            out[i] = 0.0
            out[i, g] = (1 - b) * w
            out[i, i] += b
    return out


def test_the_pulls_of_many_groupings_at_once_average_the_pull_written_out() -> None:
    """Fits (what the averaged pull fits thousands of times per uncertainty) gives, averaged over the
    groupings, the pull written out by hand: groups of one, members of unknown or no error, a grouping
    of None and groupings too small to estimate a pull from (f <= 2) included."""
    rng = np.random.default_rng(4)
    totals = rng.normal(0.1, 0.02, 12)
    errors = rng.uniform(0.005, 0.02, 12)
    errors[3], errors[7] = np.nan, 0.0
    groupings: list[list[list[int]] | None] = [None, [[0, 1, 2], [4]], [list(range(12))]]
    for _ in range(30):
        order = rng.permutation(12)
        cuts = np.sort(rng.choice(np.arange(1, 12), rng.integers(0, 6), replace=False))
        groupings.append([list(map(int, part)) for part in np.split(order, cuts)])
    fits = Fits.of(totals, errors, groupings)
    expected = np.mean([_by_hand(totals, errors, g) for g in groupings], axis=0)
    np.testing.assert_allclose(fits.maps(), expected, rtol=1e-10, atol=1e-12)
    half = np.mean([Shrinkage.fit(totals, errors, g).map(0.5) for g in groupings], axis=0)
    np.testing.assert_allclose(fits.maps(0.5), half, rtol=1e-10, atol=1e-12)
    assert np.isnan(fits.between[0]) and np.isnan(fits.between[1])  # nobody pulled; f = 1 - 2 < 0
