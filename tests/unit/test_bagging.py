"""The shrunk value's pull averaged over the groups the verdict finds in simulated reruns (bagging.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedsv.valuation.accounting import bagging
from fedsv.valuation.accounting.bagging import BAGS, INNER, bagged, pulled_many, verdict_groups
from fedsv.valuation.accounting.shrinkage import Shrinkage


def ids(k: int) -> list[str]:
    return [f"p{i:03d}" for i in range(k)]


def deviations(errors: np.ndarray, seed: int) -> np.ndarray:
    """What BAGS reruns would move each total by: its own noise."""
    return np.random.default_rng(seed).normal(0.0, 1.0, (BAGS, errors.shape[0])) * errors


def risk(k: int, gap: float, bag: bool, draws: int) -> float:
    """Mean squared error per member, in units of the noise's variance, of k members whose true totals
    are `gap` noise SDs apart, pulled within the verdict's groups (bag: averaged over reruns' groups)."""
    rng = np.random.default_rng(1000 * k + int(10 * gap))
    errors, truth = np.ones(k), gap * np.arange(k, dtype=np.float64)
    total = 0.0
    for _ in range(draws):
        totals = truth + rng.normal(0.0, 1.0, k)
        moved = rng.normal(0.0, 1.0, (BAGS, k)) if bag else None
        total += float(np.mean(np.square(bagged(ids(k), totals, errors, None, moved).apply(totals) - truth)))
    return total / draws


def test_members_that_truly_differ_are_not_pulled_to_a_worse_place_than_no_pull() -> None:
    """Members a noise SD apart: the verdict groups neighbours because they looked close, and the pull
    within one run's groups lands further from the truth than no pull (1.0); averaged over the groups of
    reruns it lands about at 1.0, while equals are still pulled together (well under 1.0)."""
    hard, averaged = risk(8, 1.0, False, 300), risk(8, 1.0, True, 300)
    assert hard > 1.15 and averaged < 1.08 and averaged < hard - 0.1, (hard, averaged)
    assert risk(8, 0.0, True, 300) < 0.5


def test_a_small_move_of_a_members_evidence_moves_its_value_a_little() -> None:
    """One member's total moved in steps of 0.05 noise SDs from beside a worthless member to among six
    equals: within the run's own groups its value jumps by over a noise SD where the verdict regroups
    it; averaged over reruns' groups no step moves it by more than a seventh of that jump, and it rises
    with its evidence."""
    errors = np.full(8, 0.01)
    base = np.array([0.10, 0.101, 0.099, 0.102, 0.098, 0.10, 0.05, 0.0])
    moved = deviations(errors, 0)
    hard, averaged = [], []
    for x in np.linspace(0.03, 0.10, 141):
        totals = base.copy()
        totals[6] = x
        hard.append(bagged(ids(8), totals, errors, None, None).apply(totals)[6])
        averaged.append(bagged(ids(8), totals, errors, None, moved).apply(totals)[6])
    jump = float(np.max(np.abs(np.diff(hard))))
    assert jump > 0.01
    assert np.max(np.abs(np.diff(averaged))) < jump / 7
    assert averaged[-1] - averaged[0] > 0.06


def test_a_member_set_apart_in_every_rerun_keeps_its_evidence_and_equals_are_pulled_together() -> None:
    """A free rider worth nothing beside nineteen equals, far beyond what a rerun moves either: every
    rerun's verdict sets it apart, so it keeps its completed total exactly; the equals' spread is more
    than halved on average."""
    truth = np.full(20, 0.05)
    truth[7] = 0.0
    errors = np.full(20, 0.002)
    spread = []
    for seed in range(5):
        totals = truth + np.random.default_rng(seed).normal(0.0, 0.002, 20)
        pull = bagged(ids(20), totals, errors, None, deviations(errors, seed))
        shrunk = pull.apply(totals)
        assert shrunk[7] == totals[7] and pull.draws == BAGS
        honest = np.arange(20) != 7
        spread.append(np.std(shrunk[honest]) / np.std(totals[honest]))
    assert np.mean(spread) < 0.5, spread


def test_the_averaged_pull_is_linear_keeps_the_order_of_levels_and_is_the_single_fit_without_reruns() -> None:
    """Three levels far apart: the averaged map is linear (the errors' parts rely on it) and a better
    level is paid more than a worse one; with no reruns to average over it is the run's own fit."""
    truth = np.repeat([0.02, 0.05, 0.08], [7, 7, 6])
    errors = 0.004 * np.linspace(0.5, 2.0, 20)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        totals = truth + rng.normal(0.0, 1.0, 20) * errors
        pull = bagged(ids(20), totals, errors, None, deviations(errors, seed))
        shrunk = pull.apply(totals)
        other = rng.normal(0.0, 0.01, 20)
        both = pull.apply(np.stack([totals, other, totals + 2 * other]))
        assert np.allclose(both[2], both[0] + 2 * both[1]) and np.allclose(pull.map() @ totals, shrunk)
        levels = [np.flatnonzero(truth == level) for level in (0.08, 0.05, 0.02)]
        for better, worse in itertools.pairwise(levels):
            assert shrunk[better].min() > shrunk[worse].max()
        single = Shrinkage.fit(totals, errors, verdict_groups(ids(20), totals, errors))
        alone = bagged(ids(20), totals, errors, None, None)
        assert alone.draws == 1 and np.array_equal(alone.apply(totals), single.apply(totals))
        assert np.allclose(alone.as_fitted(totals), single.as_fitted(totals))


def test_equals_are_paid_nearly_alike_because_the_draws_spread_as_reruns_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty equals with errors of 0.5x to 2x: the draws are centred on the totals as the averaged
    pull fits them (AROUND "bag"), so a draw spreads as a rerun of equals would and its verdict rarely
    splits them; the members' spread is cut to about a seventh. Centred on the run's own totals, every
    draw holds the run's noise twice, splits equals twice as often, and leaves a third of it."""

    def spread() -> float:
        ratios = []
        for seed in range(20):
            rng = np.random.default_rng(seed)
            errors = 0.01 * np.linspace(0.5, 2.0, 20)
            totals = 0.1 + rng.normal(0.0, 1.0, 20) * errors
            moved = rng.normal(0.0, 1.0, (BAGS, 20)) * errors
            ratios.append(np.std(bagged(ids(20), totals, errors, None, moved).apply(totals)) / np.std(totals))
        return float(np.mean(ratios))

    assert bagging.AROUND == "bag" and spread() < 0.2
    monkeypatch.setattr(bagging, "AROUND", "totals")
    assert spread() > 0.25


def test_many_reruns_pulled_at_once_are_each_pulled_as_alone() -> None:
    """pulled_many (every simulated rerun's draws grouped and fitted at once, what a rerun's part of
    the error takes) pulls each row as bagged() pulls it alone: members 0.5 to 2 errors apart, some
    with an unknown error, some not aggregated, and an exact value (verdict()'s own rules)."""
    rng = np.random.default_rng(8)
    errors = rng.uniform(0.5, 2.0, 12)
    errors[[2, 9]] = np.nan
    members = np.ones(12, dtype=bool)
    members[5] = False
    rows = rng.normal(np.arange(12) * rng.uniform(0.5, 2.0), 1.0, (30, 12))
    moves = rng.normal(0.0, 1.0, (INNER, 12)) * np.nan_to_num(errors)
    for errs in (errors, np.where(np.arange(12) == 4, 0.0, errors)):
        alone = np.array([bagged(ids(12), row, errs, members, moves).apply(row) for row in rows])
        np.testing.assert_allclose(
            pulled_many(ids(12), rows, errs, members, moves), alone, rtol=1e-10, atol=1e-12
        )
    assert not np.allclose(alone, rows)  # the rows were pulled


def test_the_draws_start_from_the_totals_as_the_averaged_pull_fits_the_truth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AROUND "bag": the draws whose groups the pull is averaged over start from the totals pulled by
    the square root of each factor (as the first average's fit estimates the truth spreads), not from
    the totals as paid (the full factor) nor the totals themselves. Members 0.8 errors apart, where the
    three starts differ."""
    rng = np.random.default_rng(4)
    errors = np.full(8, 0.01)
    totals = 0.1 + 0.008 * np.arange(8) + rng.normal(0.0, 1.0, 8) * errors
    moved = rng.normal(0.0, 1.0, (BAGS, 8)) * errors
    starts: list[np.ndarray] = []
    averaged = bagging._averaged

    def spy(*args: object) -> bagging.Pull:
        starts.append(np.asarray(args[4]))
        return averaged(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(bagging, "_averaged", spy)
    bagged(ids(8), totals, errors, None, moved)
    first = averaged(ids(8), totals, errors, None, totals + moved)
    assert len(starts) == 2 and np.allclose(starts[0], totals + moved)
    centre = starts[1] - moved
    assert np.allclose(centre, first.as_fitted(totals))
    assert not np.allclose(centre, first.apply(totals), atol=1e-4)
    assert not np.allclose(centre, totals, atol=1e-4)
