"""The functional API: methods, evaluation counts, auto choice, determinism and input validation."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from fedsv.valuation import CallableGame, Game, Plan, plan, shapley_values
from fedsv.valuation.estimators.api import AUTO_SAMPLER, make_estimator
from fedsv.valuation.estimators.spec import METHODS, SAMPLING_METHODS, ValuationSpec
from tests.support.games import additive

WEIGHTS = [0.05, 0.1, 0.2, 0.15, 0.0, 0.3]


class Counted:
    """A frozenset utility that counts its calls and checks its argument."""

    def __init__(self, weights: list[float]) -> None:
        self.utility, self.m, self.expected = additive(weights)
        self.calls = 0
        self.seen: set[frozenset[int]] = set()

    def __call__(self, subset: frozenset[int]) -> float:
        assert isinstance(subset, frozenset) and all(isinstance(i, int) for i in subset)
        self.calls += 1
        self.seen.add(subset)
        return self.utility(subset)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_on_a_frozenset_callable(method: str) -> None:
    counted = Counted(WEIGHTS)
    result = shapley_values(counted, counted.m, spec=ValuationSpec(method=method, eps=0.1, delta=0.1, seed=2))
    assert isinstance(result.values, np.ndarray) and result.values.shape == (counted.m,)
    assert result.evaluations == counted.calls == len(counted.seen)
    if method == "auto":
        assert result.method == "exact" and result.extra["plan"]["evaluations"] == 2**counted.m
    else:
        assert result.method == method
    if result.method in ("exact", "loo", "random"):
        assert result.stderr is None
    else:
        assert result.stderr is not None and result.stderr.shape == (counted.m,)
        assert np.all(np.isfinite(result.stderr))
        assert result.samples > 0 or result.evaluations == 2**counted.m  # the border was the whole game
    if method == "random":
        assert result.evaluations == 0
    else:
        np.testing.assert_allclose(result.values, counted.expected, atol=0.1)
        assert result.utility_grand == pytest.approx(sum(WEIGHTS))


def test_a_game_needs_no_m() -> None:
    game = CallableGame(additive(WEIGHTS)[0], len(WEIGHTS))
    assert shapley_values(game).values == pytest.approx(WEIGHTS)
    # a second run on the same game is served from its cache
    assert shapley_values(game, spec=ValuationSpec(method="exact")).evaluations == 0
    with pytest.raises(ValueError, match="does not match"):
        shapley_values(game, m=3)


@pytest.mark.parametrize(("m", "expected"), [(1, "exact"), (5, "exact"), (10, "exact")])
def test_auto_picks_exact_for_small_games(m: int, expected: str) -> None:
    chosen = plan(m, ValuationSpec(eps=0.05, delta=0.05, utility_range=1.0, max_exact_players=20))
    assert (chosen.method, chosen.evaluations) == ("exact", 2**m)
    assert shapley_values(additive([0.01] * m)[0], m).method == expected


def test_auto_samples_30_players_within_the_planned_budget() -> None:
    utility, m, weights = additive(list(np.linspace(0.0, 1.0 / 15, 30)))
    chosen = plan(m)
    assert chosen.method == AUTO_SAMPLER
    result = shapley_values(utility, m, spec=ValuationSpec(method="auto", budget=2_000))
    assert result.method == AUTO_SAMPLER
    assert result.evaluations <= 2_000
    assert np.max(np.abs(result.values - weights)) <= 1e-6  # an additive game is in every surrogate


def test_plan_budgets() -> None:
    spec = ValuationSpec(eps=0.05, delta=0.05, utility_range=1.0, max_exact_players=20)
    # without a budget, the Hoeffding budget of permutation sampling: 5348 permutations of 19 new prefixes
    assert plan(20, spec) == Plan(20, "auto", AUTO_SAMPLER, 2 + 5348 * 19)
    assert plan(3).method == "exact" and plan(3).evaluations == 8
    assert plan(21, ValuationSpec(budget=10**9)).method == AUTO_SAMPLER  # beyond max_exact_players
    assert plan(12, ValuationSpec(budget=4096)).method == "exact"
    assert plan(12, ValuationSpec(budget=4095)) == Plan(12, "auto", AUTO_SAMPLER, 4095)
    assert plan(12, ValuationSpec(method="svarm", budget=10)).evaluations == 26  # the border is the floor
    assert plan(12, ValuationSpec(method="loo")).evaluations == 14


def test_budgets_as_keywords_override_the_spec() -> None:
    utility, m, _ = additive(list(np.linspace(0.01, 0.2, 16)))
    result = shapley_values(utility, m, ValuationSpec(method="svarm", budget=5_000), budget=300)
    assert result.method == "svarm" and result.evaluations <= 300
    assert result.extra["plan"]["evaluations"] == 300
    fast = shapley_values(CallableGame(utility, m), budget_seconds=60.0)
    assert fast.method == "exact"  # 2^16 lookups of an additive table fit a minute anywhere
    with pytest.raises(ValueError, match="budget"):
        shapley_values(utility, m, budget=1)


def test_a_time_budget_caps_evaluations_by_the_measured_cost() -> None:
    spec = ValuationSpec(budget_seconds=1.0)
    assert plan(12, spec, seconds_per_evaluation=1e-3) == Plan(12, "auto", AUTO_SAMPLER, 1000, 1e-3)
    assert plan(12, spec, seconds_per_evaluation=1e-4).method == "exact"  # 4096 x 0.1 ms fit in 1 s
    assert plan(12, spec, seconds_per_evaluation=1.0).evaluations == 26  # never below the border


class Slow(Game):
    """An additive game whose every batch takes at least `seconds` per coalition (sleeps)."""

    def __init__(self, m: int, seconds: float) -> None:
        super().__init__(m)
        self.seconds = seconds

    def _evaluate(self, members: np.ndarray) -> np.ndarray:
        time.sleep(self.seconds * members.shape[0])
        return members.sum(axis=1) / self.m


def test_the_time_budget_is_measured_on_the_game() -> None:
    # 2^12 coalitions at >= 5 ms each take >= 20 s, far beyond a 0.2 s budget on any machine
    slow = Slow(12, 0.005)
    result = shapley_values(slow, spec=ValuationSpec(budget_seconds=0.2))
    chosen = result.extra["plan"]
    assert result.method == AUTO_SAMPLER and chosen["seconds_per_evaluation"] > 0
    assert 26 <= result.evaluations <= chosen["evaluations"] < 2**12
    # a table-lookup game: 64 coalitions fit 30 s however loaded the machine is
    fast = CallableGame(additive(WEIGHTS)[0], len(WEIGHTS))
    assert shapley_values(fast, spec=ValuationSpec(budget_seconds=30.0)).method == "exact"


@pytest.mark.parametrize("method", SAMPLING_METHODS)
def test_a_replayed_plan_gives_the_same_values(method: str) -> None:
    utility, m, _ = additive([0.3, 0.1, 0.5, 0.2, 0.4, 0.05, 0.25, 0.15])
    noisy = lambda s: utility(s) + 0.1 * math.sin(len(s) * sum(s))  # noqa: E731  (not additive)
    spec = ValuationSpec(method=method, budget_seconds=0.5, seed=3)
    first = shapley_values(noisy, m, spec=spec)
    chosen = Plan.from_dict(first.extra["plan"])
    again = shapley_values(noisy, m, spec=chosen.replay(spec))
    np.testing.assert_array_equal(first.values, again.values)
    assert again.extra["plan"]["seconds_per_evaluation"] is None


@pytest.mark.parametrize("method", SAMPLING_METHODS)
@pytest.mark.parametrize(("m", "budget"), [(5, 12), (9, 20), (9, 100), (12, 300), (7, 500)])
def test_sampling_never_exceeds_the_budget(method: str, m: int, budget: int) -> None:
    utility, _, _ = additive(list(np.linspace(0.1, 0.5, m)))
    noisy = lambda s: utility(s) + 0.05 * math.cos(3 * len(s) + sum(s))  # noqa: E731
    spec = ValuationSpec(method=method, budget=budget, seed=1)
    result = shapley_values(noisy, m, spec=spec)
    assert result.method == method
    assert result.evaluations <= max(budget, 2 * m + 2)
    assert result.values.shape == (m,) and np.all(np.isfinite(result.values))


@pytest.mark.parametrize("method", ["permutation", "group_testing", "random"])
def test_seeds_make_runs_reproducible(method: str) -> None:
    utility, m, _ = additive([0.3, 0.1, 0.5, 0.2])
    game = lambda s: utility(s) + 0.1 * math.sin(len(s) * sum(s))  # noqa: E731  (not additive)
    first = shapley_values(game, m, spec=ValuationSpec(method=method, eps=0.2, delta=0.2, seed=4)).values
    again = shapley_values(game, m, spec=ValuationSpec(method=method, eps=0.2, delta=0.2, seed=4)).values
    other = shapley_values(game, m, spec=ValuationSpec(method=method, eps=0.2, delta=0.2, seed=5)).values
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_bad_inputs_raise_value_error() -> None:
    utility, m, _ = additive([0.1, 0.2])
    bad: list[dict[str, object]] = [
        {"eps": 0.0},
        {"eps": -1.0},
        {"eps": math.inf},
        {"delta": 0.0},
        {"delta": 1.0},
        {"utility_range": 0.0},
        {"method": "shapley"},
        {"budget": 1},
        {"budget": 2.5},
        {"budget": True},
        {"budget_seconds": 0.0},
        {"budget_seconds": -1.0},
        {"budget_seconds": math.nan},
    ]
    for kwargs in bad:
        with pytest.raises(ValueError):
            shapley_values(utility, m, spec=ValuationSpec(**kwargs))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="choose one of"):
        shapley_values(utility, m, spec=ValuationSpec(method="banzhaf"))
    with pytest.raises(ValueError):
        shapley_values(utility, 0)
    with pytest.raises(ValueError, match=r"m \(number of players\) is required"):
        shapley_values(utility)
    counted = Counted([0.0] * 25)
    with pytest.raises(ValueError, match="m=25 too large for exact"):
        shapley_values(counted, 25, spec=ValuationSpec(method="exact"))
    assert counted.calls == 0
    with pytest.raises(ValueError, match="non-finite"):
        shapley_values(lambda s: math.nan if len(s) == 1 else 0.0, 3, spec=ValuationSpec(method="exact"))
    with pytest.raises(ValueError, match="outside"):
        CallableGame(utility, m).utility(frozenset({5}))
    with pytest.raises(ValueError, match="outside"):
        CallableGame(utility, m).utility(0b100)


def test_game_subclass_is_evaluated_in_batches() -> None:
    class Batched(Game):
        def __init__(self) -> None:
            super().__init__(12)
            self.batches: list[int] = []

        def _evaluate(self, members: np.ndarray) -> np.ndarray:
            self.batches.append(members.shape[0])
            return members.sum(axis=1) / 12.0

    for method in ("exact", "permutation", "group_testing", "loo"):
        game = Batched()
        shapley_values(game, spec=ValuationSpec(method=method, eps=0.2, delta=0.2))
        assert len(game.batches) <= 2, (method, game.batches)  # U(empty), U(all) first, then one batch


def test_every_method_list_derives_from_the_estimator_registry() -> None:
    from fedsv.settings.run import VALUATION_METHODS
    from fedsv.valuation.estimators.estimator import ESTIMATORS
    from fedsv.valuation.estimators.methods import BASELINES, REGISTRY, SHAPLEY_METHODS

    assert set(REGISTRY) == set(ESTIMATORS)
    assert ("auto", *REGISTRY) == METHODS
    assert set(SAMPLING_METHODS) < set(SHAPLEY_METHODS) and set(BASELINES) == {"loo", "random"}
    assert set(VALUATION_METHODS) == (set(METHODS) - {"random"}) | {"none"}
    for method, cls in REGISTRY.items():  # each plan is carried out by its own class
        spec = ValuationSpec(method=method, budget=64)
        chosen = plan(5, spec)
        assert type(make_estimator(chosen, spec)) is cls and chosen.method == method
