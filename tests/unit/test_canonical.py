"""The canonical Shapley value: games with known answers, and a coalition retrained as the run trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsv.app.canonical import RETRAINING, coalition_score, federation_canonical
from fedsv.app.demo import DemoConfig, demo_rounds
from fedsv.fl.aggregation import aggregate
from fedsv.fl.evaluation import evaluate
from fedsv.valuation.estimators.canonical import CanonicalValues, canonical_values


def glove(coalition: frozenset[int]) -> float:
    """Member 0 holds a left glove, members 1 and 2 a right one: a pair is worth 1."""
    return float(min(len(coalition & {0}), len(coalition & {1, 2})))


def test_the_glove_game_retrained_with_two_seeds_gives_its_closed_form_and_the_seeds_spread() -> None:
    calls: list[tuple[frozenset[int], int]] = []

    def retrain(coalition: frozenset[int], seed: int) -> float:
        calls.append((coalition, seed))
        return glove(coalition) * (1.1 if seed == 0 else 0.9)  # the seeds' mean is the game

    found = canonical_values(["left", "right-a", "right-b"], retrain, [0, 1])
    np.testing.assert_allclose(found.values, [2 / 3, 1 / 6, 1 / 6], atol=1e-12)
    # per seed the values are 1.1 v and 0.9 v: their SD over two seeds is 0.1 v sqrt(2), over sqrt(2)
    np.testing.assert_allclose(found.errors, 0.1 * np.array([2 / 3, 1 / 6, 1 / 6]), atol=1e-12)
    assert len(calls) == 16 and frozenset() in {c for c, _ in calls}  # every coalition, the empty one too
    assert found.utilities[0b101] == pytest.approx(1.0) and found.utilities[0b110] == 0.0


def test_an_additive_game_pays_each_member_its_own_part_whatever_the_seeds_add_to_every_coalition() -> None:
    parts = np.array([0.3, -0.1, 0.2, 0.05])
    found = canonical_values(
        list("abcd"), lambda c, seed: float(parts[list(c)].sum()) + 0.07 * seed, [0, 1, 2]
    )
    np.testing.assert_allclose(found.values, parts, atol=1e-12)
    np.testing.assert_allclose(found.errors, 0.0, atol=1e-12)
    # negative values are paid nothing; the rest split the pot by value
    np.testing.assert_allclose(found.shares(), [0.3 / 0.55, 0.0, 0.2 / 0.55, 0.05 / 0.55])


def test_nobody_worth_anything_splits_alike_and_bad_inputs_are_refused() -> None:
    nothing = CanonicalValues(["a", "b"], np.array([-0.1, 0.0]), np.zeros(2), np.zeros(4), 1)
    np.testing.assert_allclose(nothing.shares(), [0.5, 0.5])
    with pytest.raises(ValueError, match="at least one training seed"):
        canonical_values(["a"], lambda c, s: 0.0, [])
    with pytest.raises(ValueError, match=r"1\.\.12 members"):
        canonical_values([str(i) for i in range(13)], lambda c, s: 0.0, [0])


SMALL = {"participants": 2, "rounds": 2, "epochs": 1, "validation_size": 200, "valuation": "none", "seed": 3}


def test_a_coalition_is_retrained_as_the_run_trains_and_every_member_in_every_round() -> None:
    full = DemoConfig(**{**SMALL, "fraction": 1.0})  # type: ignore[arg-type]
    rounds = list(demo_rounds(full.model_copy(update=RETRAINING)))
    last = rounds[-1][0]
    final = aggregate(last.params, last.updates, last.round, last.game.aggregation)
    assert all(torch.equal(final[k], last.after[k]) for k in final)  # the round's own model
    run_score = evaluate(last.model, final, last.validation.x, last.validation.y)[0]
    assert coalition_score(full, frozenset({0, 1})) == pytest.approx(run_score)
    # the empty coalition is the initial model
    initial = full.load_task().build_model(full.seed)
    assert coalition_score(full, frozenset()) == pytest.approx(
        evaluate(initial, None, last.validation.x, last.validation.y)[0]
    )
    # half per round in the run's settings: a coalition still trains each member in every round
    half = DemoConfig(**{**SMALL, "fraction": 0.5})  # type: ignore[arg-type]
    alone = coalition_score(half, frozenset({1}))
    assert alone == pytest.approx(coalition_score(full, frozenset({1})))
    assert alone != pytest.approx(coalition_score(full, frozenset({0})))


def test_the_federations_canonical_value_splits_the_full_coalitions_gain() -> None:
    config = DemoConfig(**{**SMALL, "fraction": 0.5})  # type: ignore[arg-type]
    found = federation_canonical(config, [5])  # the run's seed replaced by each training seed
    assert found.members == ["p000", "p001"]
    assert found.values.sum() == pytest.approx(found.utilities[0b11] - found.utilities[0])
    reseeded = DemoConfig(**{**SMALL, "fraction": 0.5, "seed": 5})  # type: ignore[arg-type]
    assert found.utilities[0b11] == pytest.approx(coalition_score(reseeded, frozenset({0, 1})))
    assert found.utilities[0b10] == pytest.approx(coalition_score(reseeded, frozenset({1})))


def test_a_coalition_is_retrained_with_the_guard_off() -> None:
    """A member whose update the norm bound turns away in the run still trains in its coalitions: the
    canonical value retrains what the data train, not what the screens make of a coalition."""
    config = DemoConfig(**{**SMALL, "fraction": 1.0, "corrupt": "1=scale:1000"})  # type: ignore[arg-type]
    guarded = list(demo_rounds(config))
    assert all([u.participant for u in trained.updates] == ["p000"] for trained, _ in guarded)
    alone = coalition_score(config, frozenset({0}))
    assert coalition_score(config, frozenset({0, 1})) < alone - 0.2  # the scaled update is aggregated
