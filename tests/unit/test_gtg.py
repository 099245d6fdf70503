"""GTG-Shapley: closed-form games, between- and within-round truncation, the budget, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.estimators.exact import ExactShapley, all_coalitions
from fedsv.valuation.estimators.gtg import GTGShapley
from tests.support.games import TableGame, all_closed_form, random_table, table_of

GAMES = all_closed_form()


def no_truncation(budget: int, seed: int = 0, convergence: float = 0.05) -> GTGShapley:
    return GTGShapley(budget, seed=seed, within_tolerance=0.0, between_tolerance=0.0, convergence=convergence)


@pytest.mark.parametrize("name", sorted(GAMES))
def test_closed_form_games_without_truncation(name: str) -> None:
    utility, m, expected = GAMES[name]
    table = table_of(utility, m)
    spread = float(table.max() - table.min())
    for seed in range(3):
        # run until the cache is exhausted: close to the closed form
        full = no_truncation(4000, seed, convergence=0.0).run(TableGame(table))
        assert full.evaluations <= 2**m and not full.extra["truncated"]
        assert np.max(np.abs(full.values - expected)) <= 0.1 * spread
        assert abs(full.efficiency_residual) <= 1e-9  # untruncated permutations telescope
        # FedML's stopping rule (5% mean relative change over 10 permutations) stops early: looser
        early = no_truncation(4000, seed).run(TableGame(table))
        assert early.samples <= full.samples
        assert np.max(np.abs(early.values - expected)) <= 0.3 * spread


def test_between_round_truncation_gives_zeros_for_two_evaluations() -> None:
    table = random_table(6, np.random.default_rng(0))
    table[-1] = table[0] + 0.004  # the round barely moved the utility
    game = TableGame(table)
    result = GTGShapley(500, seed=1).run(game)
    np.testing.assert_array_equal(result.values, np.zeros(6))
    assert result.evaluations == game.evaluations == 2
    assert result.extra["truncated"] is True and result.samples == 0
    assert result.extra["tolerances"] == {"within": 0.001, "between": 0.01}
    assert not GTGShapley(500, seed=1, between_tolerance=0.001).run(TableGame(table)).extra["truncated"]


def saturating(m: int, cap: int) -> np.ndarray:
    """U(S) = min(|S|, cap): every value is cap / m; every prefix of size >= cap already equals U(N)."""
    return np.minimum(all_coalitions(m).sum(axis=1), cap).astype(float)


def test_within_round_truncation_skips_the_saturated_prefixes() -> None:
    m = 8
    table = saturating(m, 2)
    truncated = GTGShapley(10_000, seed=0, convergence=0.0).run(TableGame(table))
    full = no_truncation(10_000, seed=0, convergence=0.0).run(TableGame(table))
    # truncated walks evaluate only prefixes of sizes 1 and 2: 2 + 8 + 28 coalitions at most
    assert truncated.evaluations <= 2 + m + m * (m - 1) // 2 < full.evaluations
    assert truncated.extra["skipped_prefixes"] >= truncated.samples * (m - 3)
    # the saturated marginals are 0 anyway: nothing is lost, both stay efficient
    for result in (truncated, full):
        assert abs(result.values.sum() - 2.0) <= 1e-9
        assert np.max(np.abs(result.values - 2 / m)) <= 0.05


def test_within_round_truncation_on_an_unsaturated_game_costs_little_accuracy() -> None:
    m = 6
    table = random_table(m, np.random.default_rng(4))
    table[-1] = table.max() + 0.0005  # a few prefixes end up within 0.001 of U(N)
    truth = ExactShapley().run(TableGame(table)).values
    result = GTGShapley(2**m, seed=2, convergence=0.0).run(TableGame(table))
    assert result.extra["skipped_prefixes"] > 0
    assert abs(result.efficiency_residual) <= 0.001 + 1e-12
    assert np.max(np.abs(result.values - truth)) <= 0.05


@pytest.mark.parametrize("m", [2, 3, 6, 10])
def test_budget_is_never_exceeded(m: int) -> None:
    for k, budget in enumerate([2, 3, 4, m + 2, 2 * m + 2, 25, 100, 700]):
        table = random_table(m, np.random.default_rng(10 * m + k))
        game = TableGame(table)
        result = GTGShapley(budget, seed=k, convergence=0.0).run(game)
        assert result.evaluations == game.evaluations == game.calls <= budget
        assert result.values.shape == (m,) and np.all(np.isfinite(result.values))
        if m > 1 and budget < 2**m:
            assert result.extra["budget_exhausted"]
            assert budget - result.evaluations < m - 1  # only a permutation's last prefixes can stay unpaid
        # a game that already has some coalitions cached: only new ones are paid for
        warm = TableGame(table)
        warm.utilities(np.random.default_rng(k).random((3 * m, m)) < 0.5)
        cached = warm.evaluations
        again = GTGShapley(budget, seed=k, convergence=0.0).run(warm)
        assert again.evaluations == warm.evaluations - cached <= budget


def test_budget_too_small_for_a_permutation_splits_equally() -> None:
    table = random_table(5, np.random.default_rng(1))
    result = GTGShapley(2, seed=0).run(TableGame(table))
    assert result.samples == 0 and result.evaluations == 2
    np.testing.assert_allclose(result.values, np.full(5, (table[-1] - table[0]) / 5))


def test_single_player_is_exact() -> None:
    result = GTGShapley(2).run(TableGame(np.array([0.25, 1.0])))
    assert result.values.tolist() == [0.75] and result.evaluations == 2 and result.method == "gtg"


def test_stops_on_convergence_before_the_budget() -> None:
    m = 8
    result = GTGShapley(2**m, seed=0).run(TableGame(saturating(m, 2) + 0.1 * all_coalitions(m)[:, 0]))
    assert result.extra["converged"] and not result.extra["budget_exhausted"]
    assert result.samples > 30 and result.samples % m == 0  # tested after whole blocks of m


def test_same_seed_same_values() -> None:
    table = random_table(9, np.random.default_rng(3))
    first, again, other = (GTGShapley(300, seed=s).run(TableGame(table)) for s in (5, 5, 6))
    np.testing.assert_array_equal(first.values, again.values)
    assert first.evaluations == again.evaluations and first.samples == again.samples
    assert first.stderr is not None and again.stderr is not None
    np.testing.assert_array_equal(first.stderr, again.stderr)
    assert not np.array_equal(first.values, other.values)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget": 1},
        {"budget": None},
        {"budget": 2.0},
        {"budget": 10, "within_tolerance": -0.1},
        {"budget": 10, "between_tolerance": float("nan")},
        {"budget": 10, "convergence": float("inf")},
        {"budget": 10, "last_k": 1},
    ],
)
def test_invalid_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GTGShapley(**kwargs)  # type: ignore[arg-type]
