"""The made-up-input screen (fl.input_span): an update whose first layer moved outside the span of the
validation data's inputs, as training on made-up inputs moves it, is turned away; honest members,
IID or two classes each, with 15 samples or 450, never are."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fedsv.data import load_dataset
from fedsv.data.partition import partition_indices
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.input_span import InputSpan, input_span, off_data
from fedsv.fl.referee import ValidationReferee
from fedsv.fl.state import apply_delta, params_of
from fedsv.fl.update_bounds import NormBound
from fedsv.fl.update_guard import GuardMemory, GuardSettings, guard_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update

TRAIN = TrainConfig(epochs=2, batch_size=10, lr=0.05)
Delta = dict[str, Tensor]


@cache
def _data() -> tuple[np.ndarray, np.ndarray, EvalSet]:
    splits = load_dataset("embedded", seed=0)
    return splits.train.x, splits.train.y, EvalSet(splits.validation.x, splits.validation.y)


def _made_up(x: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """As `corrupt madeup` makes them: inputs uniform over the data's range, labels uniform."""
    rng = np.random.default_rng(seed)
    return rng.uniform(x.min(), x.max(), size=(n, *x.shape[1:])).astype(x.dtype), rng.integers(0, 10, n)


@cache
def _rounds(partition: str) -> list[tuple[dict[str, Delta], Delta]]:
    """Three FedAvg rounds of six honest members of the embedded MNIST (member 0 keeps 15 of its
    samples, member 1 holds three shards), a member trained on made-up inputs, and the same plus the
    last round's step; per round the deltas and the step that round made."""
    x, y, _ = _data()
    shards = partition_indices(y, 8, partition, 0)
    shards = [shards[0][:15], np.concatenate(shards[1:4]), *shards[4:]]
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = params_of(model)
    out: list[tuple[dict[str, Delta], Delta]] = []
    step: Delta | None = None
    for t in range(3):
        deltas = {
            f"p{i:03d}": local_update(model, params, x[s], y[s], TRAIN, seed=100 * t + i)
            for i, s in enumerate(shards)
        }
        made_x, made_y = _made_up(x, 150, seed=t)
        made = local_update(model, params, made_x, made_y, TRAIN, seed=999 + t)
        honest = list(deltas.values())
        mean = {k: torch.stack([d[k] for d in honest]).mean(0) for k in honest[0]}
        deltas["madeup"] = made
        if step is not None:
            deltas["madeup+step"] = {k: made[k] + step[k] for k in made}
        out.append((deltas, mean))
        step = mean
        params = apply_delta(params, mean)
    return out


def _updates(deltas: dict[str, Delta], *names: str) -> list[ClientUpdate]:
    return [ClientUpdate(n, deltas[n], 150) for n in names]


@cache
def _span() -> InputSpan:
    span = input_span(build_model("mlp", (1, 28, 28), seed=0), _data()[2])
    assert span is not None
    return span


def test_the_span_is_the_first_layers_input_subspace_of_the_validation_data() -> None:
    span = _span()
    assert span.weight == "1.weight" and span.dimension == 784
    assert 0.3 < span.isotropic < 0.7  # MNIST leaves about half the pixel directions empty
    basis = span.basis
    assert torch.allclose(basis.T @ basis, torch.eye(basis.shape[1], dtype=basis.dtype), atol=1e-8)
    # a delta whose rows are validation images lies inside; one of isotropic noise puts its share outside
    images = torch.as_tensor(_data()[2].x[:64].reshape(64, -1), dtype=torch.float64)
    assert span.outside({"1.weight": images})[1] < 0.01
    noise = torch.randn(64, 784, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(span.outside({"1.weight": noise})[1] - span.isotropic) < 0.05


@pytest.mark.parametrize("partition", ["iid", "noniid"])
def test_honest_members_are_never_turned_away_and_made_up_ones_always(partition: str) -> None:
    honest = [f"p{i:03d}" for i in range(6)]
    for t, (deltas, _) in enumerate(_rounds(partition)):
        assert off_data(_updates(deltas, *honest), _span()) == {}, (partition, t)
        for rider in ("madeup", "madeup+step"):
            if rider in deltas:
                found = off_data(_updates(deltas, *honest, rider), _span())
                assert set(found) == {rider}, (partition, t, rider, found)
                assert found[rider] > 0.05


def test_a_diluted_made_up_update_stands_apart_from_its_round_not_from_noise() -> None:
    deltas, _ = _rounds("iid")[2]
    diluted = _span().outside(deltas["madeup+step"])[1]
    assert diluted < 0.5 * _span().isotropic  # below the absolute line: the round's comparison finds it
    assert off_data(_updates(deltas, "p002", "p003", "madeup+step"), _span()) == {"madeup+step": diluted}
    assert off_data(_updates(deltas, "p002", "madeup+step"), _span()) == {}  # two: no round to compare


def test_a_majority_off_the_data_says_the_validation_set_is_not_theirs() -> None:
    deltas, _ = _rounds("iid")[1]
    madeups = {f"m{i}": deltas["madeup"] for i in range(3)}
    updates = [*_updates(deltas, "p002", "p003"), *(ClientUpdate(n, d, 150) for n, d in madeups.items())]
    assert off_data(updates, _span()) == {}
    assert set(off_data(updates[:3], _span())) == {"m0"}


def test_the_guard_turns_a_made_up_update_away_with_its_screens_only() -> None:
    _, _, validation = _data()
    model = build_model("mlp", (1, 28, 28), seed=0)
    deltas, _ = _rounds("iid")[0]
    updates = _updates(deltas, "p002", "p003", "p004", "madeup")
    referee = ValidationReferee(model, params_of(model), validation)
    rule = NormBound("clip-or-reject")
    guarded = guard_updates(updates, rule, GuardSettings(), GuardMemory(), [150] * 4, referee, None, _span())
    assert set(guarded.made_up) == {"madeup"} and "madeup" not in {u.participant for u in guarded.updates}
    off = GuardSettings(direction=False)
    unscreened = guard_updates(updates, rule, off, GuardMemory(), [150] * 4, referee, None, _span())
    assert not unscreened.made_up and "madeup" in {u.participant for u in unscreened.updates}


class _Normalized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(784)
        self.head = nn.Linear(784, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(x.flatten(1)))


def _models() -> Iterator[tuple[str, nn.Module]]:
    yield "cnn", build_model("cnn", (1, 28, 28), seed=0)  # 5x5 patches fill nearly every direction
    yield "batchnorm first", _Normalized()  # its first layer's inputs depend on parameters


@pytest.mark.parametrize(("case", "model"), list(_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_screen_stays_silent_where_it_cannot_tell(case: str, model: nn.Module) -> None:
    assert input_span(model, _data()[2]) is None, case
    tabular = EvalSet(np.random.default_rng(0).normal(size=(200, 30)).astype(np.float32), np.zeros(200))
    assert input_span(nn.Sequential(nn.Linear(30, 2)), tabular) is None  # features fill every direction
