"""The trusted step (fl.trusted_step, task.validation_step): an update that points against the step the
validation set itself takes from w_t (a sign flip, inner-product manipulation, also when colluders are
the majority of a round) is turned away; honest members, two classes each or one class with 30 images,
never are."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from fedsv.data import load_dataset
from fedsv.data.collusion import colluded_update
from fedsv.data.partition import partition_indices
from fedsv.data.sources import Samples
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.referee import ValidationReferee
from fedsv.fl.selection import train_seed
from fedsv.fl.state import apply_delta, params_of
from fedsv.fl.trusted_step import TrustedStep, against_step, step_cosines, threshold
from fedsv.fl.update_bounds import NormBound
from fedsv.fl.update_guard import GuardMemory, GuardSettings, guard_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.task import TrainContext, load_task
from fedsv.task.interface import LoadedTask
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.task.validation_step import LocalTraining, validation_step

TRAIN = TrainConfig(epochs=2, batch_size=10, lr=0.05)
Delta = dict[str, Tensor]
HONEST = [f"p{i:03d}" for i in range(5)]
ONE_CLASS = "one-class"


@cache
def _data() -> tuple[np.ndarray, np.ndarray, EvalSet]:
    splits = load_dataset("embedded", seed=0)
    return splits.train.x, splits.train.y, EvalSet(splits.validation.x, splits.validation.y)


def _negate(delta: Mapping[str, Tensor]) -> Delta:
    return {k: -t for k, t in delta.items()}


@cache
def _rounds() -> list[tuple[dict[str, Delta], Delta, Delta]]:
    """Three FedAvg rounds of the embedded MNIST, two classes per member (five honest members, a sixth
    holding 30 images of one class), plus a sign flip of member 0's data and two colluders' inner-product
    manipulation of members 1 and 2's; per round every delta, the trusted step and w_t."""
    x, y, validation = _data()
    shards = partition_indices(y, 6, "noniid", 0)
    one_class = np.flatnonzero(y == y[shards[5][0]])[:30]
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = params_of(model)
    out: list[tuple[dict[str, Delta], Delta, Delta]] = []
    for t in range(3):
        deltas = {
            p: local_update(model, params, x[s], y[s], TRAIN, seed=100 * t + i)
            for i, (p, s) in enumerate(zip(HONEST, shards[:5], strict=True))
        }
        deltas[ONE_CLASS] = local_update(model, params, x[one_class], y[one_class], TRAIN, seed=100 * t + 9)
        deltas["flip"] = _negate(deltas["p000"])
        deltas["ipm"] = colluded_update("ipm", 2.0, [deltas["p001"], deltas["p002"]])
        step = local_update(model, params, validation.x, validation.y, TRAIN, seed=7 + t)
        out.append((deltas, step, params))
        honest = [deltas[p] for p in [*HONEST, ONE_CLASS]]
        params = apply_delta(params, {k: torch.stack([d[k] for d in honest]).mean(0) for k in honest[0]})
    return out


def _updates(deltas: Mapping[str, Delta], *names: str) -> list[ClientUpdate]:
    return [ClientUpdate(n, deltas[n], 150) for n in names]


@pytest.mark.parametrize("t", range(3))
def test_sign_flips_and_inner_product_manipulation_are_turned_away_and_honest_members_kept(t: int) -> None:
    deltas, step, _ = _rounds()[t]
    round_ = _updates(deltas, *HONEST, ONE_CLASS, "flip", "ipm")
    cosines = step_cosines(round_, step)
    assert min(cosines[p] for p in [*HONEST, ONE_CLASS]) > 0, cosines  # honest: along the step
    assert set(against_step(round_, step)) == {"flip", "ipm"}, cosines


def test_colluders_that_are_the_majority_of_a_round_are_turned_away() -> None:
    """Two colluders and one honest member: no rule over the round's updates alone tells them apart."""
    deltas, step, _ = _rounds()[1]
    assert set(against_step(_updates(deltas, "flip", "ipm", "p003"), step)) == {"flip", "ipm"}


def test_a_round_the_validation_set_disagrees_with_entirely_is_left_alone() -> None:
    deltas, step, _ = _rounds()[0]
    assert against_step(_updates(deltas, "flip", "ipm"), step) == {}
    assert against_step(_updates(deltas, *HONEST), _negate(step)) == {}


def test_the_threshold_is_a_random_directions_reach_in_a_small_model() -> None:
    assert threshold(100_000) == -0.05  # MARGIN: beyond a random direction's 5/sqrt(d) = 0.016
    assert threshold(530) == pytest.approx(-5 / math.sqrt(530))  # a tabular task's small network
    rng = torch.Generator().manual_seed(0)
    step = {"w": torch.randn(62, generator=rng, dtype=torch.float64)}
    noise = [ClientUpdate(f"r{i}", {"w": torch.randn(62, generator=rng)}, 1) for i in range(200)]
    # random directions in 62 dimensions reach -0.05 often, the threshold (5 SD) never
    assert sum(c < -0.05 for c in step_cosines(noise, step).values()) > 50
    assert against_step(noise, step) == {}


def test_the_guard_turns_them_away_first_and_values_their_effect() -> None:
    deltas, step, _ = _rounds()[1]
    validation = _data()[2]
    model = build_model("mlp", (1, 28, 28), seed=0)
    updates = _updates(deltas, *HONEST[:3], "flip", "ipm")
    referee = ValidationReferee(model, params_of(model), validation)
    guarded = guard_updates(
        updates, NormBound(), GuardSettings(), GuardMemory(), [150] * 5, referee, trusted=lambda: step
    )
    assert set(guarded.against) == {"flip", "ipm"}
    assert [u.participant for u in guarded.updates] == HONEST[:3]
    assert {"flip", "ipm"} <= set(guarded.evidence)  # their effect is the reputation's evidence
    off = guard_updates(
        updates, NormBound(), GuardSettings(trusted_step=False), GuardMemory(), [150] * 5, referee,
        trusted=lambda: step,
    )  # fmt: skip
    assert off.against == {}


def test_the_validation_step_trains_the_validation_set_as_a_member_trains_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = load_task("fedsv.tasks:mnist_mlp")
    model = task.build_model(0)
    params = params_of(model)
    _, _, validation = _data()
    training = LocalTraining(seed=3, participants=6, epochs=1, batch_size=10, lr=0.05)
    calls: list[int] = []
    train = LoadedTask.local_update

    def counted(*args: Any, **kwargs: Any) -> dict[str, Tensor]:
        calls.append(1)
        return train(*args, **kwargs)

    monkeypatch.setattr(LoadedTask, "local_update", counted)
    step = validation_step(task, model, params, validation, training, round_number=2)
    first = step()
    assert set(first) == {n for n, p in model.named_parameters() if p.requires_grad}
    context = TrainContext(round=2, rank=6, seed=train_seed(3, 2, 6), epochs=1, batch_size=10, lr=0.05)
    samples = Samples(np.asarray(validation.x), np.asarray(validation.y), "validation")
    expected = task.local_update(task.build_model(0), params, samples, context)
    for name, t in first.items():
        torch.testing.assert_close(t, expected[name].to(torch.float64))
    assert step() is first and len(calls) == 2  # the step trained once, however often the guard asks


def test_the_whole_guard_keeps_the_honest_one_class_member_round_after_round() -> None:
    """The full guard (its reputation included) over the three rounds: the 30-image one-class member and
    the two-class members are never turned away nor quarantined; the flip and IPM always are."""
    memory, validation = GuardMemory(), _data()[2]
    model = build_model("mlp", (1, 28, 28), seed=0)
    for deltas, step, params in _rounds():
        round_ = _updates(deltas, *HONEST, ONE_CLASS, "flip", "ipm")
        referee = ValidationReferee(model, params, validation)
        guarded = guard_updates(
            round_, NormBound(), GuardSettings(), memory, [150] * 8, referee, params, trusted=_fixed(step)
        )
        assert [u.participant for u in guarded.updates] == [*HONEST, ONE_CLASS], guarded
        assert set(guarded.reputation.quarantined) <= {"flip", "ipm"} and set(guarded.against) <= {
            "flip",
            "ipm",
        }
        assert set(guarded.against) | set(guarded.held) == {"flip", "ipm"}  # turned away, or held


def _fixed(step: Delta) -> TrustedStep:
    return lambda: step


def test_a_round_of_one_update_trains_no_step() -> None:
    """A lone update is never turned away, so the coordinator spends no training on its round."""
    deltas, _, params = _rounds()[0]
    referee = ValidationReferee(build_model("mlp", (1, 28, 28), seed=0), params, _data()[2])

    def untrainable() -> Delta:
        raise AssertionError("the step was trained for a round of one update")

    guarded = guard_updates(
        _updates(deltas, "flip"),
        NormBound(),
        GuardSettings(),
        GuardMemory(),
        [150],
        referee,
        trusted=untrainable,
    )
    assert [u.participant for u in guarded.updates] == ["flip"]
