"""Permutation sampling and group testing under a hard evaluation budget; balanced permutations."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.estimators.group_testing import GroupTesting
from fedsv.valuation.estimators.permutation import PermutationSampling, balanced_permutations
from tests.support.games import TableGame, random_table

Sampler = PermutationSampling | GroupTesting


def exact(table: np.ndarray) -> np.ndarray:
    return ExactShapley().run(TableGame(table)).values


def sampler(kind: str, budget: int | None, seed: int = 0) -> Sampler:
    if kind == "permutation":
        return PermutationSampling(seed=seed, budget=budget)
    return GroupTesting(seed=seed, budget=budget)


@pytest.mark.parametrize("kind", ["permutation", "group_testing"])
@pytest.mark.parametrize("m", [2, 3, 5, 8, 12])
def test_budget_is_never_exceeded(kind: str, m: int) -> None:
    budgets = sorted({2, 3, 5, m + 1, 2 * m + 2, 37, 200, 2**m - 1, 2**m, 2**m + 9} - {1})
    for k, budget in enumerate(b for b in budgets if b >= 2 and (m < 12 or b <= 1000)):
        game = TableGame(random_table(m, np.random.default_rng(100 * m + k)))
        result = sampler(kind, budget, seed=k).run(game)
        assert result.evaluations == game.evaluations == game.calls <= budget
        assert result.values.shape == (m,) and np.all(np.isfinite(result.values))
        if m > 1 and budget < 2**m:  # stops only when the next sample's new coalitions do not fit
            most_per_sample = m - 1 if kind == "permutation" else 1
            assert budget - result.evaluations < most_per_sample


@pytest.mark.parametrize("kind", ["permutation", "group_testing"])
def test_only_new_coalitions_count_against_the_budget(kind: str) -> None:
    m = 7
    game = TableGame(random_table(m, np.random.default_rng(3)))
    game.utilities(np.random.default_rng(4).random((40, m)) < 0.5)  # some coalitions cached beforehand
    cached = game.evaluations
    result = sampler(kind, 30, seed=1).run(game)
    assert result.evaluations == game.evaluations - cached <= 30


@pytest.mark.parametrize("kind", ["permutation", "group_testing"])
def test_a_fully_cached_game_costs_nothing_and_sampling_still_ends(kind: str) -> None:
    table = random_table(5, np.random.default_rng(8))
    game = TableGame(table)
    truth = ExactShapley().run(game).values  # every coalition cached now
    result = sampler(kind, 2, seed=0).run(game)
    assert result.evaluations == 0
    assert 1000 <= result.samples <= 100_000
    assert np.max(np.abs(result.values - truth)) <= 0.03


@pytest.mark.parametrize("kind", ["permutation", "group_testing"])
def test_budget_of_all_coalitions_reaches_near_exact_values(kind: str) -> None:
    m = 6
    table = random_table(m, np.random.default_rng(21))
    result = sampler(kind, 2**m, seed=2).run(TableGame(table))
    assert result.evaluations <= 2**m
    assert result.samples >= 5000
    assert np.max(np.abs(result.values - exact(table))) <= 0.03


def test_budget_too_small_for_any_permutation_splits_equally() -> None:
    table = random_table(5, np.random.default_rng(2))
    result = PermutationSampling(budget=4).run(TableGame(table))
    assert result.samples == 0 and result.evaluations <= 4
    np.testing.assert_allclose(result.values, np.full(5, (table[-1] - table[0]) / 5))
    assert result.stderr is not None and np.all(np.isnan(result.stderr))


def test_explicit_count_caps_a_budgeted_run() -> None:
    game = TableGame(random_table(6, np.random.default_rng(5)))
    assert PermutationSampling(count=7, budget=10_000).run(game).samples == 7
    assert (
        GroupTesting(count=9, budget=10_000).run(TableGame(random_table(6, np.random.default_rng(5)))).samples
        == 9
    )


@pytest.mark.parametrize("budget", [0, 1, -5, 2.5, True])
def test_invalid_budgets_are_refused(budget: object) -> None:
    with pytest.raises(ValueError, match="budget"):
        PermutationSampling(budget=budget)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        GroupTesting(budget=budget)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("count", "m"), [(0, 4), (1, 4), (7, 3), (12, 4), (13, 4), (50, 7), (1000, 12), (5, 1)]
)
def test_balanced_permutations_put_every_player_first_equally_often(count: int, m: int) -> None:
    perms = balanced_permutations(count, m, np.random.default_rng(count + m))
    assert perms.shape == (count, m)
    np.testing.assert_array_equal(np.sort(perms, axis=1), np.tile(np.arange(m), (count, 1)))
    for leading in {count, count // 2, max(0, count - 1)}:  # any leading rows stay balanced
        firsts = np.bincount(perms[:leading, 0], minlength=m)
        assert set(firsts.tolist()) <= {leading // m, leading // m + 1}


def test_balanced_permutations_are_uniform_after_the_first_position() -> None:
    m, count = 4, 24_000
    perms = balanced_permutations(count, m, np.random.default_rng(0))
    # every (first, second) pair of distinct players is equally likely: 1 / (m (m - 1))
    pairs = np.bincount(perms[:, 0] * m + perms[:, 1], minlength=m * m).reshape(m, m)
    expected = count / (m * (m - 1))
    off_diagonal = pairs[~np.eye(m, dtype=bool)]
    assert np.all(np.diag(pairs) == 0)
    assert np.all(np.abs(off_diagonal - expected) <= 5 * np.sqrt(expected))


@pytest.mark.parametrize("budget", [None, 10_000])
def test_balanced_first_positions_make_a_first_come_game_exact(budget: int | None) -> None:
    # U(S) = [S is not empty]: only the first player of a permutation earns (1), every value is 1/m.
    # Balanced first positions make every whole block of m permutations exact.
    m = 5
    table = np.ones(2**m)
    table[0] = 0.0
    result = PermutationSampling(count=3 * m, seed=4, budget=budget).run(TableGame(table))
    np.testing.assert_allclose(result.values, np.full(m, 1 / m), atol=1e-12)
    assert result.samples == 3 * m
    partial = PermutationSampling(count=3 * m + 2, seed=4).run(TableGame(table))
    assert set(np.round(partial.values * (3 * m + 2)).astype(int).tolist()) == {3, 4}


def test_permutation_estimate_is_unbiased_with_a_partial_block() -> None:
    m, runs = 4, 2000
    table = random_table(m, np.random.default_rng(5))
    estimates = np.array(
        [PermutationSampling(count=6, seed=s).run(TableGame(table)).values for s in range(runs)]
    )
    stderr = estimates.std(axis=0, ddof=1) / np.sqrt(runs)
    assert np.all(np.abs(estimates.mean(axis=0) - exact(table)) <= 5 * stderr)


@pytest.mark.parametrize("kind", ["permutation", "group_testing"])
@pytest.mark.parametrize("budget", [None, 150])
def test_same_seed_same_values(kind: str, budget: int | None) -> None:
    table = random_table(8, np.random.default_rng(9))

    def make(seed: int) -> Sampler:
        if kind == "permutation":
            return PermutationSampling(eps=0.3, delta=0.2, seed=seed, budget=budget)
        return GroupTesting(eps=0.3, delta=0.2, seed=seed, budget=budget)

    first, again, other = (make(s).run(TableGame(table)) for s in (3, 3, 4))
    np.testing.assert_array_equal(first.values, again.values)
    assert first.evaluations == again.evaluations and first.samples == again.samples
    assert not np.array_equal(first.values, other.values)


def test_budget_is_recorded_and_samples_are_permutations_used() -> None:
    m, budget = 10, 300
    result = PermutationSampling(budget=budget, seed=1).run(
        TableGame(random_table(m, np.random.default_rng(1)))
    )
    assert result.extra["budget"] == budget
    assert 300 // (m - 1) - 1 <= result.samples <= 300  # at most m - 1 new prefixes per permutation
    assert result.stderr is not None and np.all(np.isfinite(result.stderr))
