"""The identical-update screen (fl.identical_updates): members that send the very same vector (a
colluding group's crafted update) are turned away, all of them; a second identity training a copy of an
owner's data with its own seed, and free riders' zero updates, are not taken for one."""

from __future__ import annotations

import torch

from fedsv.data import load_dataset
from fedsv.data.collusion import colluded_update
from fedsv.fl.identical_updates import identical_updates
from fedsv.fl.state import params_of
from fedsv.fl.update_bounds import NormBound
from fedsv.fl.update_guard import GuardMemory, GuardSettings, guard_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from tests.support.toy_referee import toy_round


def _update(pid: str, delta: dict[str, torch.Tensor]) -> ClientUpdate:
    return ClientUpdate(pid, delta, 100)


def test_a_groups_one_vector_is_found_and_a_copy_trained_with_its_own_seed_is_not() -> None:
    splits = load_dataset("embedded", seed=0)
    x, y = splits.train.x[:300], splits.train.y[:300]
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = params_of(model)
    train = TrainConfig(epochs=1, batch_size=10, lr=0.05)
    own = [local_update(model, params, x[i::3], y[i::3], train, seed=i) for i in range(3)]
    copy = local_update(model, params, x[0::3], y[0::3], train, seed=7)  # owner 0's file, its own seed
    alie = colluded_update("alie", 1.5, own[1:])
    updates = [
        *(_update(f"p{i}", d) for i, d in enumerate(own)),
        _update("copy", copy),
        _update("c1", alie),
        _update("c2", {k: t.clone() for k, t in alie.items()}),
        _update("c3", {k: t.float().double().float() for k, t in alie.items()}),  # a float32 round trip
    ]
    assert identical_updates(updates) == {"c1": "c2", "c2": "c1", "c3": "c1"}


def test_zero_updates_are_left_to_the_null_screen() -> None:
    zero = {"w": torch.zeros(10)}
    assert (
        identical_updates([_update("a", zero), _update("b", dict(zero)), _update("c", {"w": torch.ones(10)})])
        == {}
    )


def test_the_guard_turns_the_whole_group_away_and_never_empties_a_round() -> None:
    updates, referee = toy_round(seed=0, m=4)
    crafted = updates[0].delta
    group = [ClientUpdate(p, {k: t.clone() for k, t in crafted.items()}, 100) for p in ("x1", "x2")]
    guarded = guard_updates(
        [*updates[1:], *group], NormBound(), GuardSettings(), GuardMemory(), [100] * 5, referee
    )
    assert guarded.identical == {"x1": "x2", "x2": "x1"}
    assert sorted(u.participant for u in guarded.updates) == ["p001", "p002", "p003"]
    alone = guard_updates(group, NormBound(), GuardSettings(), GuardMemory(), [100] * 5, referee)
    assert [u.participant for u in alone.updates] == ["x1"] and set(alone.identical) == {"x2"}
