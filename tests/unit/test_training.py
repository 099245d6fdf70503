"""Local SGD updates (deterministic, seeded, backdoor-aware), evaluation and FedAvg."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fedsv.data import DatasetSplits, load_dataset
from fedsv.data.corruptions import Corruption, PixelBackdoor
from fedsv.fl.evaluation import evaluate
from fedsv.fl.state import apply_delta, fedavg, load_params, params_of
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny batches gain nothing from intra-op threads, and on a busy 2-core box OpenMP's spinning
    workers make them ~100x slower; restore the setting for the other test modules."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def splits() -> DatasetSplits:
    return load_dataset("embedded", seed=0)


def test_train_config_validation() -> None:
    assert TrainConfig().batch_size == 32
    for kwargs in ({"epochs": 0}, {"batch_size": 0}, {"lr": 0.0}, {"momentum": 1.0}, {"weight_decay": -1.0}):
        with pytest.raises(ValueError):
            TrainConfig(**kwargs)


def test_local_update_deterministic(splits: DatasetSplits) -> None:
    x, y = splits.train.x[:96], splits.train.y[:96]
    config = TrainConfig(epochs=1, batch_size=32, lr=0.05)
    for name in ("mlp", "cnn_mnist"):  # the CNN has dropout: it must be seeded too
        model = build_model(name, splits.input_shape, seed=0)
        start = params_of(model)
        torch.manual_seed(123)
        before = torch.random.get_rng_state()
        a = local_update(model, start, x, y, config, seed=7)
        assert torch.equal(torch.random.get_rng_state(), before)  # caller's RNG untouched
        b = local_update(model, start, torch.from_numpy(x), torch.from_numpy(y), config, seed=7)
        c = local_update(model, start, x, y, config, seed=8)
        assert a.keys() == start.keys() == dict(model.named_parameters()).keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert all(a[k].dtype == start[k].dtype and not a[k].requires_grad for k in a)
        assert any(not torch.equal(a[k], c[k]) for k in a)
        assert any(float(a[k].abs().max()) > 0 for k in a)


def test_local_training_learns(splits: DatasetSplits) -> None:
    model = build_model("mlp", splits.input_shape, seed=0)
    start = params_of(model)
    acc0, loss0 = evaluate(model, start, splits.validation.x, splits.validation.y)
    config = TrainConfig(epochs=5, batch_size=32, lr=0.05, momentum=0.9)
    delta = local_update(model, start, splits.train.x[:1000], splits.train.y[:1000], config, seed=0)
    acc, loss = evaluate(model, apply_delta(start, delta), splits.validation.x, splits.validation.y)
    assert acc0 < 0.3 and acc > 0.8 and loss < loss0
    # evaluate with params leaves the model alone; with None it uses the model's own parameters.
    trained = params_of(model)
    assert all(torch.allclose(trained[k], start[k] + delta[k], atol=1e-6) for k in start)
    assert evaluate(model, None, splits.validation.x, splits.validation.y)[0] == pytest.approx(acc, abs=2e-3)


def test_local_update_with_backdoor(splits: DatasetSplits) -> None:
    model = build_model("mlp", splits.input_shape, seed=0)
    start = params_of(model)
    x, y = splits.train.x[:128], splits.train.y[:128]
    config = TrainConfig(batch_size=64)
    clean = local_update(model, start, x, y, config, seed=1)
    corrupt = Corruption(backdoor=PixelBackdoor())
    poisoned = local_update(model, start, x, y, config, seed=1, corruption=corrupt)
    again = local_update(model, start, x, y, config, seed=1, corruption=corrupt)
    assert any(not torch.equal(clean[k], poisoned[k]) for k in clean)
    assert all(torch.equal(poisoned[k], again[k]) for k in poisoned)


def test_local_update_errors(splits: DatasetSplits) -> None:
    model = build_model("mlp", splits.input_shape, seed=0)
    start = params_of(model)
    with pytest.raises(ValueError, match="no training samples"):
        local_update(model, start, splits.train.x[:0], splits.train.y[:0], TrainConfig(), seed=0)
    with pytest.raises(ValueError, match="parameter names differ"):
        local_update(
            model,
            {"1.weight": start["1.weight"]},
            splits.train.x[:8],
            splits.train.y[:8],
            TrainConfig(),
            seed=0,
        )
    with pytest.raises(ValueError, match="labels"):
        local_update(model, start, splits.train.x[:8], splits.train.y[:7], TrainConfig(), seed=0)


def test_evaluate_known_model() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 2, bias=False))
    params = {"1.weight": torch.eye(2)}
    x = np.array([[[[2.0, 0.0]]], [[[0.0, 2.0]]], [[[1.0, 0.0]]], [[[0.0, 1.0]]]], dtype=np.float32)
    y = np.array([0, 1, 1, 1])
    acc, loss = evaluate(model, params, x, y, batch_size=3)
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0]])
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor(y)).item()
    assert acc == 0.75 and loss == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="no samples"):
        evaluate(model, params, x[:0], y[:0])


def test_fedavg_and_apply_delta() -> None:
    d1 = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    d2 = {"w": torch.tensor([4.0, 8.0]), "b": torch.tensor([3.0])}
    avg = fedavg([d1, d2], [1, 2])
    assert torch.allclose(avg["w"], torch.tensor([3.0, 6.0]))
    assert torch.allclose(avg["b"], torch.tensor([2.0]))
    assert avg["w"].dtype == torch.float32
    assert torch.equal(fedavg([d1], [5])["w"], d1["w"])
    params = {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([1.0])}
    moved = apply_delta(params, d1, scale=0.5)
    assert torch.equal(moved["w"], torch.tensor([1.5, 2.0])) and torch.equal(params["w"], torch.ones(2))
    with pytest.raises(ValueError, match="at least one"):
        fedavg([], [])
    with pytest.raises(ValueError, match="2 deltas but 1 weights"):
        fedavg([d1, d2], [1])
    with pytest.raises(ValueError, match="parameter names differ"):
        fedavg([d1, {"w": d2["w"]}], [1, 1])
    with pytest.raises(ValueError, match="positive sum"):
        fedavg([d1, d2], [0, 0])
    with pytest.raises(ValueError, match="parameter names differ"):
        apply_delta(params, {"w": d1["w"]})


def _batchnorm_mlp(seed: int) -> torch.nn.Sequential:
    """784 -> 16 with BatchNorm1d after the first Linear: float running_mean/var, int num_batches_tracked."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(784, 16),
            torch.nn.BatchNorm1d(16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 10),
        )


def test_float_buffers_travel_and_integer_buffers_stay_local(splits: DatasetSplits) -> None:
    model = _batchnorm_mlp(0)
    start = params_of(model)
    buffers = {"2.running_mean", "2.running_var"}
    assert start.keys() == {*dict(model.named_parameters()), *buffers}
    assert "2.num_batches_tracked" in model.state_dict() and "2.num_batches_tracked" not in start
    x, y = splits.train.x, splits.train.y
    config = TrainConfig(batch_size=16)
    deltas = [
        local_update(model, start, x[48 * i : 48 * i + 48], y[48 * i : 48 * i + 48], config, seed=i)
        for i in range(2)
    ]
    for delta in deltas:
        assert delta.keys() == start.keys()  # running statistics included, the batch counter not
        assert all(float(delta[k].abs().max()) > 0 for k in buffers)  # BatchNorm updated them in train mode
    # The model holds trained = start + delta, buffers too; its batch counter counted both updates.
    trained = params_of(model)
    assert all(torch.allclose(trained[k], start[k] + deltas[-1][k], atol=1e-6) for k in start)
    assert int(model.state_dict()["2.num_batches_tracked"]) == 2 * 3
    # FedAvg averages buffers exactly like parameters.
    avg = fedavg(deltas, [1, 3])
    for k in start:
        assert torch.allclose(avg[k], (deltas[0][k] + 3 * deltas[1][k]) / 4, atol=1e-7)
    new = apply_delta(start, avg)
    # load_params loads the buffers; predict/evaluate with params use them (eval mode).
    fresh = _batchnorm_mlp(5)
    load_params(fresh, new)
    assert all(torch.equal(fresh.state_dict()[k], new[k]) for k in new)
    assert int(fresh.state_dict()["2.num_batches_tracked"]) == 0  # never loaded
    xv, yv = splits.validation.x, splits.validation.y
    assert evaluate(model, new, xv, yv) == evaluate(fresh, None, xv, yv)
    stale = {**new, **{k: start[k] for k in buffers}}
    assert evaluate(model, stale, xv, yv)[1] != evaluate(model, new, xv, yv)[1]  # the buffers matter
    with pytest.raises(ValueError, match="unexpected"):
        load_params(fresh, {**new, "2.num_batches_tracked": torch.tensor(0)})
    with pytest.raises(ValueError, match=r"missing \['2.running_var'\]"):
        load_params(fresh, {k: v for k, v in new.items() if k != "2.running_var"})
    with pytest.raises(ValueError, match=r"2\.running_mean has shape"):
        load_params(fresh, {**new, "2.running_mean": torch.zeros(3)})
    with pytest.raises(ValueError, match="parameter names differ"):
        evaluate(model, {k: v for k, v in new.items() if k not in buffers}, xv, yv)
