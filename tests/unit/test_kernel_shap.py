"""Paired KernelSHAP and Leverage SHAP: closed forms, budgets, exactness, efficiency, seeds and error bars."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.estimators.budget import minimum_budget
from fedsv.valuation.estimators.exact import ExactShapley, all_coalitions
from fedsv.valuation.estimators.kernel_shap import KernelSHAP, LeverageSHAP, random_coalitions, unrank
from fedsv.valuation.games.game import BoolMatrix, CallableGame, FloatArray, Game
from tests.support.games import TableGame, additive, all_closed_form, random_table, table_of

GAMES = all_closed_form()
ESTIMATORS = [KernelSHAP, LeverageSHAP]
Estimator = type[KernelSHAP] | type[LeverageSHAP]


def exact_values(table: FloatArray) -> FloatArray:
    return ExactShapley().run(TableGame(table)).values


def table(m: int, seed: int) -> FloatArray:
    return random_table(m, np.random.default_rng(seed))


class LinearGame(Game):
    """U(S) = 1 + sum_{i in S} w_i (+ a small sine bend): for players beyond a table's reach."""

    def __init__(self, weights: FloatArray, bend: float = 0.0) -> None:
        super().__init__(len(weights))
        self.weights, self.bend = weights, bend

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        linear = members @ self.weights
        return np.asarray(1.0 + linear + self.bend * np.sin(3 * linear), dtype=np.float64)


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("name", sorted(GAMES))
def test_closed_form_games(name: str, cls: Estimator) -> None:
    utility, m, expected = GAMES[name]
    values = table_of(utility, m)
    budget = max(minimum_budget(m), 3 * 2**m // 4)
    result = cls(budget, seed=1).run(TableGame(values))
    assert result.method == cls.method and result.evaluations <= budget
    spread = float(values.max() - values.min())
    tolerance = 1e-9 if name in ("additive", "squared_sum") else 0.2 * spread  # additive, quadratic: exact
    np.testing.assert_allclose(result.values, expected, rtol=0, atol=tolerance)
    assert abs(result.efficiency_residual) < 1e-9


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("budget", [22, 60, 200])
def test_additive_and_quadratic_games_are_recovered_exactly(cls: Estimator, budget: int) -> None:
    rng = np.random.default_rng(budget)
    m = 10
    a, b = rng.normal(size=m), np.triu(rng.normal(size=(m, m)), 1)
    z = all_coalitions(m).astype(np.float64)
    linear, quadratic = 0.3 + z @ a, 0.3 + z @ a + np.einsum("ki,ij,kj->k", z, b, z)
    for values in (linear, quadratic):  # paired sampling cancels every second-order interaction
        result = cls(budget, seed=budget).run(TableGame(values))
        np.testing.assert_allclose(result.values, exact_values(values), rtol=0, atol=1e-9)


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("m", range(3, 15))
def test_budget_is_never_exceeded(cls: Estimator, m: int) -> None:
    values = table(m, m)
    for budget in sorted({minimum_budget(m), 2 * m + 3, 3 * m, 50, 200, 2**m - 1, 2**m + 5}):
        if budget < minimum_budget(m):
            continue
        game = TableGame(values)
        result = cls(budget, seed=m).run(game)
        assert result.evaluations == game.evaluations == game.calls <= budget
        assert result.samples <= budget and result.samples % 2 == 0
        assert abs(result.efficiency_residual) < 1e-9
        assert result.stderr is not None and result.stderr.shape == (m,)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_a_budget_a_little_short_of_everything_is_spent(cls: Estimator) -> None:
    values = table(9, 4)
    for budget in (300, 2**9 - 1):
        game = TableGame(values)
        result = cls(budget, seed=2).run(game)
        assert budget - 1 <= result.evaluations <= budget  # a last pair may need two evaluations, one left


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("m", [2, 3, 5, 8, 10])
def test_a_budget_of_every_coalition_gives_exact_values(cls: Estimator, m: int) -> None:
    values = table(m, 10 + m)
    for budget in (2**m, 2**m + 100):
        result = cls(budget, seed=3).run(TableGame(values))
        np.testing.assert_allclose(result.values, exact_values(values), rtol=0, atol=1e-9)
        assert result.evaluations == 2**m and result.samples == 0
        np.testing.assert_array_equal(result.stderr, np.zeros(m))


def test_leverage_draws_small_strata_whole_and_they_become_exact() -> None:
    values = table(12, 5)
    result = LeverageSHAP(4000, seed=0).run(TableGame(values))
    assert result.extra["exact_sizes"] == [5, 7]  # C(12, 5) = 792 pairs fit, the 462 middle pairs do not
    error = np.abs(result.values - exact_values(values)).max()
    assert error < 0.01


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_seeds(cls: Estimator) -> None:
    values = table(10, 6)
    first = cls(300, seed=7).run(TableGame(values))
    again = cls(300, seed=7).run(TableGame(values))
    other = cls(300, seed=8).run(TableGame(values))
    np.testing.assert_array_equal(first.values, again.values)
    np.testing.assert_array_equal(first.stderr, again.stderr)
    assert first.extra == again.extra
    assert np.abs(first.values - other.values).max() > 1e-6


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_accuracy_and_standard_errors_across_seeds(cls: Estimator) -> None:
    values = table(10, 9)
    exact = exact_values(values)
    runs = [cls(300, seed=seed).run(TableGame(values)) for seed in range(30)]
    estimates = np.array([r.values for r in runs])
    errors = np.abs(estimates - exact).max(axis=1)
    assert np.abs(estimates.mean(axis=0) - exact).max() < np.median(errors)  # little bias
    assert np.median(errors) < 0.1  # values are about 1/m = 0.1 of a utility in [0, 1]
    spread = estimates.std(axis=0, ddof=1)  # the error a single run makes, per player
    reported = np.array([r.stderr for r in runs]).mean(axis=0)
    assert np.all(np.isfinite(reported))
    assert np.all(reported < 3 * spread) and np.all(reported > spread / 3)
    assert 2 / 3 < np.median(reported / spread) < 3 / 2


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_more_budget_is_more_accurate(cls: Estimator) -> None:
    values = table(12, 11)
    exact = exact_values(values)
    median = [
        np.median([np.abs(cls(b, seed=s).run(TableGame(values)).values - exact).max() for s in range(6)])
        for b in (200, 1000, 3000)
    ]
    assert median[0] > median[1] > median[2]


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_a_cached_game_costs_nothing_and_still_terminates(cls: Estimator) -> None:
    values = table(9, 12)
    game = TableGame(values)
    exact = ExactShapley().run(game).values  # every coalition cached
    result = cls(100, seed=0).run(game)
    assert result.evaluations == 0
    assert np.abs(result.values - exact).max() < 0.05  # the free draws fill the regression


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_a_second_run_spends_its_own_budget(cls: Estimator) -> None:
    game = TableGame(table(11, 13))
    first = cls(400, seed=0).run(game)
    second = cls(400, seed=1).run(game)
    assert first.evaluations <= 400 and 300 < second.evaluations <= 400
    assert game.evaluations == first.evaluations + second.evaluations


@pytest.mark.parametrize("cls", ESTIMATORS)
@pytest.mark.parametrize("m", [40, 64, 70])
def test_many_players(cls: Estimator, m: int) -> None:
    weights = np.random.default_rng(m).normal(size=m)
    result = cls(3000, seed=0).run(LinearGame(weights))
    np.testing.assert_allclose(result.values, weights, rtol=0, atol=1e-9)
    assert result.evaluations <= 3000
    bent = cls(3000, seed=0).run(LinearGame(weights, bend=0.1))
    assert np.abs(bent.values - weights).max() < 0.1 and abs(bent.efficiency_residual) < 1e-9


def test_one_player_and_a_callable_game() -> None:
    for cls in ESTIMATORS:
        result = cls(2).run(CallableGame(lambda s: 3.0 if s else 1.0, 1))
        assert result.values.tolist() == [2.0] and result.evaluations == 2
        utility, m, weights = additive([0.5, -0.2, 1.3, 0.0, 0.7], offset=2.0)
        result = cls(20, seed=4).run(CallableGame(utility, m))
        np.testing.assert_allclose(result.values, weights, atol=1e-9)


def test_coalition_sampling_is_uniform_within_a_size() -> None:
    rows = unrank(6, np.full(15, 2), np.arange(15))
    assert len({r.tobytes() for r in rows}) == 15 and np.all(rows.sum(axis=1) == 2)
    drawn = random_coalitions(np.random.default_rng(0), 6, np.full(15000, 2))
    masks = drawn.astype(np.int64) @ (1 << np.arange(6))
    counts = np.unique(masks, return_counts=True)[1]
    assert counts.shape == (15,) and counts.min() > 850 and counts.max() < 1150
    wide = random_coalitions(np.random.default_rng(0), 70, np.array([0, 1, 35, 69, 70]))
    assert wide.sum(axis=1).tolist() == [0, 1, 35, 69, 70]


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_bad_budgets(cls: Estimator) -> None:
    for bad in (0, 1, 1.5, True, -3, "100"):
        with pytest.raises(ValueError, match="budget"):
            cls(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"budget 21 is below the 22 border"):
        cls(21).run(TableGame(table(10, 0)))
    assert cls(22).run(TableGame(table(10, 0))).evaluations == 22
