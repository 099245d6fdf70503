"""The functional API: methods, evaluation counts, auto choice, determinism and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsv.valuation import CallableGame, Game, plan, shapley_values
from fedsv.valuation.spec import METHODS, ValuationSpec
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
        assert result.method == "exact" and result.extra["plan"]["exact"] == 2**counted.m
    else:
        assert result.method == method
    if result.method in ("exact", "loo", "random"):
        assert result.stderr is None
    else:
        assert result.stderr is not None and result.stderr.shape == (counted.m,)
        assert np.all(np.isfinite(result.stderr)) and result.samples > 0
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
    costs = plan(m, ValuationSpec(eps=0.05, delta=0.05, utility_range=1.0, max_exact_players=20))
    assert costs["exact"] == 2**m
    assert shapley_values(additive([0.01] * m)[0], m).method == expected


def test_auto_picks_sampling_for_30_players() -> None:
    utility, m, weights = additive(list(np.linspace(0.0, 1.0 / 15, 30)))
    costs = plan(m)
    assert "exact" not in costs
    result = shapley_values(utility, m, spec=ValuationSpec(method="auto"))
    assert result.method == min(costs, key=lambda k: costs[k]) == "group_testing"
    assert result.evaluations <= costs["group_testing"]
    assert np.max(np.abs(result.values - weights)) <= 0.05


def test_plan_costs() -> None:
    costs = plan(20, ValuationSpec(eps=0.05, delta=0.05, utility_range=1.0, max_exact_players=20))
    assert costs == {"exact": 2**20, "permutation": 2 + 5348 * 19, "group_testing": 37315}
    assert plan(3) == {"exact": 8, "permutation": 8, "group_testing": 8}
    assert set(plan(21)) == {"permutation", "group_testing"}


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
