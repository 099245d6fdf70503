"""A game's memo: the dense bitmask table and the dict agree, count evaluations alike, and feed exact."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.estimators.exact import (
    ExactShapley,
    all_coalitions,
    shapley_from_dense,
    shapley_from_table,
)
from fedsv.valuation.games.game import DENSE_PLAYERS, Game, bitmasks, members_of


class Weighted(Game):
    """U(S) = sum of S's weights + a bonus for the grand coalition; records every evaluated batch."""

    def __init__(self, m: int, seed: int = 0) -> None:
        super().__init__(m)
        self.weights = np.random.default_rng(seed).random(m)
        self.batches: list[int] = []

    def _evaluate(self, members: np.ndarray) -> np.ndarray:
        self.batches.append(members.shape[0])
        return members @ self.weights + 0.5 * members.all(axis=1) + 0.1 * (members.sum(axis=1) == 2)


@pytest.mark.parametrize("m", [1, 3, 8, 13, 40])
def test_bitmasks_round_trip(m: int) -> None:
    rows = np.random.default_rng(m).random((50, m)) < 0.5
    masks = bitmasks(rows)
    assert np.array_equal(members_of(masks, m), rows)
    assert np.array_equal(masks, rows @ (1 << np.arange(m, dtype=np.int64)))


@pytest.mark.parametrize("m", [1, 2, 5, 9])
def test_shapley_from_dense_equals_the_membership_sum(m: int) -> None:
    rows = all_coalitions(m)
    utilities = np.random.default_rng(m).normal(size=2**m)
    table = np.empty(2**m)
    table[bitmasks(rows)] = utilities
    np.testing.assert_allclose(shapley_from_dense(table), shapley_from_table(rows, utilities), atol=1e-13)


def test_shapley_from_dense_refuses_holes_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="missing or non-finite"):
        shapley_from_dense(np.array([0.0, np.nan, 1.0, 2.0]))
    with pytest.raises(ValueError, match="2\\^m"):
        shapley_from_dense(np.zeros(6))


@pytest.mark.parametrize("m", [DENSE_PLAYERS, DENSE_PLAYERS + 2])
def test_dense_and_dict_memos_agree(m: int) -> None:
    """Same utilities, same distinct counts, repeats never re-evaluated, on either memo."""
    rows = np.random.default_rng(1).random((300, m)) < 0.5
    rows = np.concatenate([rows, rows[:40]])  # repeats inside one call
    dense, sparse = Weighted(m), Weighted(m)
    dense.use_dense_table()
    assert dense.dense_table() is not None
    assert (sparse.dense_table() is None) == (m > DENSE_PLAYERS)
    fresh = dense.new_rows(rows)
    assert np.array_equal(fresh, sparse.new_rows(rows))
    np.testing.assert_allclose(dense.utilities(rows), sparse.utilities(rows), atol=1e-15)
    assert dense.evaluations == sparse.evaluations == int(fresh.sum()) == len({r.tobytes() for r in rows})
    before = list(dense.batches)
    dense.utilities(rows[::-1])
    assert dense.batches == before and not dense.new_rows(rows).any()


def test_use_dense_table_keeps_what_was_cached() -> None:
    game = Weighted(DENSE_PLAYERS + 3)
    rows = np.random.default_rng(2).random((64, game.m)) < 0.5
    first = game.utilities(rows)
    count = game.evaluations
    game.use_dense_table()
    assert game.evaluations == count
    batches = list(game.batches)
    np.testing.assert_array_equal(game.utilities(rows), first)
    assert game.batches == batches  # nothing evaluated again


def test_exact_enumerates_in_chunks_and_matches_the_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedsv.valuation.estimators.exact.ENUMERATION_CHUNK", 2**7)
    game = Weighted(10)
    game.utility(0b11)  # one coalition cached before: counted once, not evaluated again
    result = ExactShapley().run(game)
    assert game.batches[1:] == [2**7 - 1] + [2**7] * 7  # 0b11 lies in the first chunk
    assert result.evaluations == 2**10 - 1 and game.evaluations == 2**10
    # The pair bonus is symmetric and nets to 0 per player (+0.1/m as a 2nd member, -0.1/m as a 3rd).
    expected = game.weights + 0.5 / 10
    np.testing.assert_allclose(result.values, expected, atol=1e-12)
    assert np.isclose(result.values.sum(), result.utility_grand - result.utility_empty)
