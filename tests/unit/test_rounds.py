"""Federated SV accounting across rounds: totals, normalization, group rationality, validation."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation import FederatedValuation, RoundValues, shapley_values
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.estimators.spec import ValuationSpec
from tests.support.games import TableGame, random_table

ROUNDS = [
    (1, ["a", "b", "c"]),
    (2, ["b", "d"]),
    (3, ["a", "c", "d", "e"]),
    (4, ["c"]),
]


def round_table(round_: int, m: int) -> np.ndarray:
    # each round starts where the previous ended (U(empty) = utility_before != 0)
    return 0.5 + 0.1 * round_ + 0.1 * random_table(m, np.random.default_rng(round_))


def run_rounds(method: str = "exact") -> tuple[FederatedValuation, dict[int, np.ndarray]]:
    fv = FederatedValuation()
    tables = {}
    for round_, ids in ROUNDS:
        tables[round_] = round_table(round_, len(ids))
        rv = fv.value_round(
            TableGame(tables[round_]),
            ids,
            round_,
            spec=ValuationSpec(method=method, eps=0.1, delta=0.1, seed=round_),
        )
        assert rv.method == method and rv.evaluations > 0 and rv.seconds >= 0
    return fv, tables


def test_totals_are_sums_over_rounds() -> None:
    fv, tables = run_rounds()
    totals = fv.totals()
    assert set(totals) == {"fedsv", "fedsv_normalized", "fedsv_completed", "fedsv_shrunk", "loo"} | {
        "loo_normalized"
    }
    expected: dict[str, dict[str, float]] = {key: {} for key in totals}
    for round_, ids in ROUNDS:
        fedsv = ExactShapley().run(TableGame(tables[round_])).values
        full = tables[round_][-1]
        loo = np.array([full - tables[round_][(2 ** len(ids) - 1) & ~(1 << i)] for i in range(len(ids))])
        for key, vector in (("fedsv", fedsv), ("loo", loo)):
            norm = np.linalg.norm(vector)
            for pid, v, n in zip(ids, vector, vector / norm, strict=True):
                expected[key][pid] = expected[key].get(pid, 0.0) + v
                expected[key + "_normalized"][pid] = expected[key + "_normalized"].get(pid, 0.0) + n
    # completion: tests/unit/test_completion.py; shrinkage: tests/unit/test_shrinkage.py
    for key in (k for k in totals if k not in ("fedsv_completed", "fedsv_shrunk")):
        assert totals[key].keys() == expected[key].keys()
        for pid in totals[key]:
            assert totals[key][pid] == pytest.approx(expected[key][pid], abs=1e-12)


def test_per_round_and_group_rationality() -> None:
    fv, tables = run_rounds()
    rounds = fv.per_round()
    assert [rv.round for rv in rounds] == [1, 2, 3, 4]
    for rv in rounds:
        assert rv.utility_before == tables[rv.round][0] and rv.utility_after == tables[rv.round][-1]
    residuals = fv.group_rationality_residuals()
    assert set(residuals) == {1, 2, 3, 4}
    assert max(abs(r) for r in residuals.values()) < 1e-9
    # long-term group rationality: the totals distribute the sum of the per-round gains
    gain = sum(t[-1] - t[0] for t in tables.values())
    assert sum(fv.totals()["fedsv"].values()) == pytest.approx(gain, abs=1e-9)


def test_sampling_rounds_and_unselected_participants() -> None:
    fv, _ = run_rounds("group_testing")
    assert max(abs(r) for r in fv.group_rationality_residuals().values()) < 1e-9
    totals = fv.totals()["fedsv"]
    assert "z" not in totals and set(totals) == {"a", "b", "c", "d", "e"}


def test_zero_vector_stays_zero_when_normalized() -> None:
    fv = FederatedValuation()
    fv.add_round(RoundValues(1, ["a", "b"], np.zeros(2), np.zeros(2), 0.3, 0.3, "exact", 4, 0.0))
    fv.add_round(RoundValues(2, ["b"], np.array([-2.0]), np.array([0.5]), 0.3, -1.7, "exact", 2, 0.0))
    totals = fv.totals()
    assert totals["fedsv_normalized"] == {"a": 0.0, "b": -1.0}
    assert totals["loo_normalized"] == {"a": 0.0, "b": 1.0}
    assert totals["fedsv"] == {"a": 0.0, "b": -2.0}


def test_invalid_rounds_raise() -> None:
    fv = FederatedValuation()
    rv = RoundValues(1, ["a"], np.ones(1), np.ones(1), 0.0, 1.0, "exact", 2, 0.0)
    fv.add_round(rv)
    with pytest.raises(ValueError, match="already recorded"):
        fv.add_round(rv)
    with pytest.raises(ValueError, match="already recorded"):
        fv.value_round(TableGame(np.array([0.0, 1.0])), ["a"], 1)
    with pytest.raises(ValueError, match="duplicate"):
        RoundValues(2, ["a", "a"], np.ones(2), np.ones(2), 0.0, 1.0, "exact", 4, 0.0)
    with pytest.raises(ValueError, match="participants"):
        RoundValues(2, ["a", "b"], np.ones(3), np.ones(2), 0.0, 1.0, "exact", 4, 0.0)
    with pytest.raises(ValueError, match="strings"):
        RoundValues(2, [1, 2], np.ones(2), np.ones(2), 0.0, 1.0, "exact", 4, 0.0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="participant ids"):
        fv.value_round(TableGame(np.zeros(4)), ["a"], 5)


def test_value_round_shares_the_cache_between_estimator_and_loo() -> None:
    table = round_table(9, 4)
    game = TableGame(table)
    rv = FederatedValuation().value_round(game, list("wxyz"), 9, spec=ValuationSpec(method="exact"))
    assert rv.evaluations == game.calls == 16  # LOO's coalitions were already evaluated by exact
    np.testing.assert_allclose(
        rv.fedsv, shapley_values(TableGame(table), spec=ValuationSpec(method="exact")).values
    )
