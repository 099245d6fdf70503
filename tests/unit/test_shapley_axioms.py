"""Exact Shapley values satisfy the axioms on random games (efficiency, symmetry, null player, additivity)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsv.valuation.estimators.exact import ExactShapley, all_coalitions, shapley_weights
from tests.support.games import TableGame

EXAMPLES = settings(max_examples=40, deadline=None)
game_seeds = st.integers(min_value=0, max_value=2**32 - 1)
sizes = st.integers(min_value=1, max_value=8)


def exact(table: np.ndarray) -> np.ndarray:
    return ExactShapley().run(TableGame(table)).values


@EXAMPLES
@given(m=sizes, seed=game_seeds, offset=st.floats(-1e3, 1e3))
def test_efficiency_with_nonzero_empty(m: int, seed: int, offset: float) -> None:
    table = np.random.default_rng(seed).normal(size=2**m) + offset
    values = exact(table)
    assert abs(values.sum() - (table[-1] - table[0])) <= 1e-9 * max(1.0, abs(offset))


@EXAMPLES
@given(m=st.integers(2, 8), seed=game_seeds)
def test_symmetry(m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    i, j = rng.choice(m, size=2, replace=False)
    rows = all_coalitions(m)
    # Utility depends on the members other than i, j and only on how many of {i, j} are present.
    others = rows.copy()
    others[:, [i, j]] = False
    key = others @ (1 << np.arange(m)) * 3 + rows[:, i].astype(int) + rows[:, j].astype(int)
    table = rng.normal(size=key.max() + 1)[key]
    values = exact(table)
    assert abs(values[i] - values[j]) <= 1e-9


@EXAMPLES
@given(m=st.integers(2, 8), seed=game_seeds)
def test_null_player(m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    null = int(rng.integers(m))
    rows = all_coalitions(m)
    without = rows.copy()
    without[:, null] = False
    table = rng.normal(size=2**m)[without @ (1 << np.arange(m))]
    values = exact(table)
    assert abs(values[null]) <= 1e-9


@EXAMPLES
@given(m=sizes, seed=game_seeds)
def test_additivity(m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    u1, u2 = rng.normal(size=2**m), rng.uniform(-5, 5, size=2**m)
    np.testing.assert_allclose(exact(u1 + u2), exact(u1) + exact(u2), atol=1e-9)


def test_weights_sum_over_coalitions_to_one() -> None:
    for m in range(1, 12):
        w = shapley_weights(m)
        counts = np.array([np.prod(range(m - s, m)) // np.prod(range(1, s + 1)) for s in range(m)])
        assert abs(float(np.sum(w * counts)) - 1.0) <= 1e-12


def test_single_player_and_row_order() -> None:
    rows = all_coalitions(3)
    assert rows.shape == (8, 3)
    np.testing.assert_array_equal(rows @ (1 << np.arange(3)), np.arange(8))
    assert exact(np.array([4.0, 7.5]))[0] == 3.5
