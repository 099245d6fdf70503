"""The reconstructed run game: each coalition's model rebuilt from the run's aggregated updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsv.fl.aggregation import AggregationRule, aggregate
from fedsv.fl.evaluation import EvalSet, to_tensors
from fedsv.fl.state import params_of
from fedsv.fl.updates import ClientUpdate
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.round.reconstructed import ReconstructedRun
from fedsv.valuation.round.round_inputs import score_params


def _setup() -> tuple[nn.Module, dict[str, torch.Tensor], EvalSet, list[list[ClientUpdate]]]:
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    initial = params_of(model)
    rng = np.random.default_rng(0)
    validation = EvalSet(rng.normal(size=(60, 5)).astype(np.float32), rng.integers(0, 3, 60))

    def update(pid: str, count: int) -> ClientUpdate:
        return ClientUpdate(pid, {k: torch.randn_like(v) for k, v in initial.items()}, count)

    rounds = [
        [update("a", 10), update("b", 30)],  # round 1: a and b
        [update("b", 20), update("c", 20)],  # round 2: b and c
        [update("a", 5), update("c", 15)],  # round 3: a and c
    ]
    return model, initial, validation, rounds


def test_every_coalition_is_rebuilt_from_its_members_aggregated_updates_as_fedavg_weighs_them() -> None:
    model, initial, validation, rounds = _setup()
    game = ReconstructedRun(model, initial, rounds, ["a", "b", "c"], validation)
    x, y = to_tensors(validation.x, validation.y)
    # the empty coalition is the initial model
    assert game.utilities(np.array([[False, False, False]]))[0] == pytest.approx(
        score_params(model, initial, x, y, "accuracy")
    )
    # all three: the run's own model, each round's FedAvg by sample counts (10 and 30, ...)
    made = initial
    for number, updates in enumerate(rounds, start=1):
        made = aggregate(made, updates, number, AggregationRule())
    rebuilt = game.params(np.array([True, True, True]))
    assert all(torch.allclose(rebuilt[k], made[k], atol=1e-6) for k in made)
    # a alone: its own updates in rounds 1 and 3, round 2 (without it) adds nothing
    alone = game.params(np.array([True, False, False]))
    expected = {k: initial[k] + rounds[0][0].delta[k] + rounds[2][0].delta[k] for k in initial}
    assert all(torch.allclose(alone[k], expected[k], atol=1e-6) for k in initial)
    # a and b: round 1 both (10:30), round 2 b alone, round 3 a alone
    pair = game.params(np.array([True, True, False]))
    expected = {
        k: initial[k]
        + 0.25 * rounds[0][0].delta[k]
        + 0.75 * rounds[0][1].delta[k]
        + rounds[1][0].delta[k]
        + rounds[2][0].delta[k]
        for k in initial
    }
    assert all(torch.allclose(pair[k], expected[k], atol=1e-6) for k in initial)
    values = ExactShapley().run(game).values
    assert values.sum() == pytest.approx(
        score_params(model, made, x, y, "accuracy") - score_params(model, initial, x, y, "accuracy")
    )


def test_updates_from_someone_who_is_not_a_player_are_refused() -> None:
    model, initial, validation, rounds = _setup()
    with pytest.raises(ValueError, match="not players"):
        ReconstructedRun(model, initial, rounds, ["a", "b"], validation)
    with pytest.raises(ValueError, match="distinct"):
        ReconstructedRun(model, initial, rounds, ["a", "b", "c", "a"], validation)
