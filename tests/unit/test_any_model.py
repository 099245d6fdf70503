"""RoundGame on models that are not the paper's: found fast paths, custom forwards, BatchNorm, metrics."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsv.data import load_dataset
from fedsv.fl.state import apply_delta, fedavg, load_params, params_of
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import all_coalitions
from fedsv.valuation.round.executors.stem_split import split_stem
from fedsv.valuation.round.executors.traced_split import find_stem
from fedsv.valuation.round.round_game import MODES
from fedsv.valuation.round.round_inputs import Metric

NUM_VAL = 100
Params = dict[str, Tensor]
Data = tuple[np.ndarray, np.ndarray, Tensor, Tensor]
"""Training images and labels (float32, numpy), validation images (float64) and labels."""


@pytest.fixture(scope="module")
def data() -> Data:
    splits = load_dataset("embedded", seed=0, validation_size=NUM_VAL, test_size=100)
    x_val = torch.from_numpy(splits.validation.x).double()
    return splits.train.x, splits.train.y, x_val, torch.from_numpy(splits.validation.y)


def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build().double()


def _random_round(
    model: nn.Module, m: int = 3, seed: int = 0, step: float = 0.3
) -> tuple[Params, list[Params]]:
    """w_t (the model's state) and m random deltas of a sizeable fraction of each tensor's spread."""
    gen = torch.Generator().manual_seed(seed)
    g = params_of(model)
    deltas = [
        {
            k: step * (float(v.std(correction=0)) + 1e-2) * torch.randn(v.shape, generator=gen, dtype=v.dtype)
            for k, v in g.items()
        }
        for _ in range(m)
    ]
    return g, deltas


def _hand_utilities(
    model: nn.Module,
    g: Params,
    deltas: list[Params],
    counts: list[int],
    x: Tensor,
    y: Tensor,
    metric: Callable[[Tensor, Tensor], Tensor],
) -> np.ndarray:
    """U of every coalition: w_t + FedAvg_S(deltas), parameters and buffers, loaded plainly, eval mode."""
    model = copy.deepcopy(model)
    out = []
    for row in all_coalitions(len(deltas)):
        members = [i for i in range(len(deltas)) if row[i]]
        state = (
            g
            if not members
            else apply_delta(g, fedavg([deltas[i] for i in members], [counts[i] for i in members]))
        )
        load_params(model, state)
        model.eval()
        with torch.no_grad():
            out.append(float(metric(model(x), y).double().mean()))
    return np.array(out)


def _accuracy(logits: Tensor, y: Tensor) -> Tensor:
    return logits.argmax(dim=1) == y


def _neg_loss(logits: Tensor, y: Tensor) -> Tensor:
    return -F.cross_entropy(logits, y, reduction="none")


def _check_modes(
    model: nn.Module,
    g: Params,
    deltas: list[Params],
    counts: list[int],
    x: Tensor,
    y: Tensor,
    expected_modes: dict[str, str],
) -> None:
    """Every requested mode runs as expected_modes says and matches the hand-built FedAvg models."""
    reference = {
        metric: _hand_utilities(model, g, deltas, counts, x, y, fn)
        for metric, fn in (("accuracy", _accuracy), ("neg_loss", _neg_loss))
    }
    assert len(set(reference["accuracy"].tolist())) > 1  # the coalitions do not all score the same
    members = all_coalitions(len(deltas))
    for requested, actual in expected_modes.items():
        for metric, expected in reference.items():
            game = RoundGame(model, g, deltas, counts, x, y, metric=metric, mode=requested)
            assert game.mode == actual, requested
            got = game.utilities(members)
            if metric == "accuracy":
                np.testing.assert_array_equal(got, expected)
            else:
                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- (a) a user's Sequential


@pytest.mark.parametrize("nested", [False, True])
def test_user_sequential_takes_the_fast_path(
    data: Data, nested: bool, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, x, y = data

    def build() -> nn.Module:
        if nested:  # nested Sequentials are flattened; an Identity is a pure reshape
            return nn.Sequential(
                nn.Sequential(nn.Identity(), nn.Flatten(), nn.Linear(784, 24)), nn.ReLU(), nn.Linear(24, 10)
            )
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 24), nn.ReLU(), nn.Linear(24, 10))

    model = _seeded(1, build)
    g, deltas = _random_round(model)
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(model, g, deltas, [10, 20, 40], x, y, {mode: mode for mode in MODES})
    assert "RoundGame mode 'fast'" in caplog.text and "head by stacked matmul" in caplog.text
    split, _ = split_stem(model, g)
    assert split is not None and split.stem_names == {
        "weight": "0.2.weight" if nested else "1.weight",
        "bias": "0.2.bias" if nested else "1.bias",
    }


def test_stem_as_the_last_layer(data: Data) -> None:
    """Logistic regression: the head is empty, the coalition's stem output is its logits."""
    _, _, x, y = data
    model = _seeded(2, lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 10)))
    g, deltas = _random_round(model, step=3.0)
    _check_modes(model, g, deltas, [3, 1, 2], x, y, {mode: mode for mode in MODES})


def test_linear_stem_over_extra_dimensions(data: Data) -> None:
    """A Linear stem applied per row of each image (input (n, 28, 28)): the deltas stack on the last dim."""
    _, _, x, y = data
    model = _seeded(
        10,
        lambda: nn.Sequential(
            nn.Flatten(1, 2), nn.Linear(28, 4), nn.ReLU(), nn.Flatten(), nn.Linear(28 * 4, 10)
        ),
    )
    g, deltas = _random_round(model)
    _check_modes(model, g, deltas, [4, 5, 6], x, y, {mode: mode for mode in MODES})


def test_head_outside_the_stacked_executor_runs_under_vmap(
    data: Data, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, x, y = data
    model = _seeded(3, lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 24), nn.Tanh(), nn.Linear(24, 10)))
    g, deltas = _random_round(model)
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(model, g, deltas, [5, 5, 5], x, y, {mode: mode for mode in MODES})
    assert "head by vmap" in caplog.text


# --------------------------------------------------------------------------- (b) any nn.Module, traced


class SkipNet(nn.Module):
    """A residual connection around the hidden layer: nothing nn.Sequential can express."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 24)
        self.fc2 = nn.Linear(24, 24)
        self.out = nn.Linear(24, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        return self.out(h + torch.relu(self.fc2(h)))


class QuickstartNet(nn.Module):
    """Flower's quickstart-pytorch Net (its forward as Flower writes it), on 1x28x28 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class ScaledSequential(nn.Sequential):
    """A Sequential subclass whose forward is no longer the layer chain."""

    def forward(self, x: Tensor) -> Tensor:
        return 2.0 * super().forward(x)


@pytest.mark.parametrize(
    ("seed", "build", "how"),
    [
        (4, SkipNet, "traced: Linear 'fc1' after 1 parameter-free steps -> a head of 5 steps; head by vmap"),
        (
            7,
            QuickstartNet,
            "traced: Conv2d 'conv1' after 0 parameter-free steps -> a head of 9 steps (a layer chain); "
            "head by stacked matmul",
        ),
        (5, lambda: ScaledSequential(nn.Flatten(), nn.Linear(784, 10)), "traced: Linear '1'"),
        (
            8,
            lambda: nn.Sequential(nn.Flatten(), nn.ReLU(), nn.Linear(784, 12), nn.ReLU(), nn.Linear(12, 10)),
            "traced: Linear '2' after 2 parameter-free steps",
        ),
    ],
)
def test_traced_models_take_the_fast_path(
    data: Data, seed: int, build: Callable[[], nn.Module], how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Any nn.Module whose first layer is a Linear or Conv2d fed only by the input: the traced split
    gives the hand-built FedAvg models' utilities, in every mode."""
    _, _, x, y = data
    model = _seeded(seed, build)
    g, deltas = _random_round(model, step=1.0)
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(model, g, deltas, [7, 3, 5], x, y, {mode: mode for mode in MODES})
    assert how in caplog.text


class InputSkip(nn.Module):
    """The input reaches the output past the first layer: the stem's output is not all the head sees."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 16)
        self.out = nn.Linear(16, 10)
        self.proj = nn.Linear(784, 10)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(1)
        return self.out(torch.relu(self.fc1(flat))) + self.proj(flat)


class BranchNet(nn.Module):
    """Control flow on the data: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: Tensor) -> Tensor:
        out = self.fc(x.flatten(1))
        return out if float(x.sum()) > 0 else -out


class ItemNet(nn.Module):
    """Reads a weight as a Python float: fine for one model, impossible under vmap (batched .item())."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1)) / float(self.fc.weight.abs().max())


@pytest.mark.parametrize(
    ("seed", "build", "reason"),
    [
        (4, InputSkip, "no fast path: 'flatten', computed before the first layer, is also used by 'proj'"),
        (5, BranchNet, "no fast path: torch.fx cannot trace BranchNet (TypeError: float() argument"),
    ],
)
def test_models_without_a_split_use_batched(
    data: Data, seed: int, build: Callable[[], nn.Module], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, x, y = data
    model = _seeded(seed, build)
    g, deltas = _random_round(model, step=1.0)
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(
            model, g, deltas, [7, 3, 5], x, y, {"fast": "batched", "batched": "batched", "naive": "naive"}
        )
    assert reason in caplog.text


class ItemScale(nn.Module):
    """A layer with a parameter it reads as a Python float (fails under vmap once it is batched)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        return x * float(self.scale)


def test_model_that_fails_under_vmap_uses_naive(data: Data, caplog: pytest.LogCaptureFixture) -> None:
    _, _, x, y = data
    model = _seeded(6, ItemNet)
    g, deltas = _random_round(model, step=1.0)
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(
            model, g, deltas, [1, 2, 3], x, y, {"fast": "naive", "batched": "naive", "naive": "naive"}
        )
    assert "vmap over the model fails" in caplog.text
    caplog.clear()
    # A Sequential with a linear stem whose head fails under vmap: neither fast nor batched.
    model = _seeded(6, lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 10), ItemScale()))
    g, deltas = _random_round(model, step=1.0)
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(model, g, deltas, [1, 2, 3], x, y, {"fast": "naive", "batched": "naive"})
    assert "but its head fails under vmap (RuntimeError" in caplog.text


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (
            lambda: nn.Sequential(nn.ReLU(), nn.Linear(4, 2)),
            "'0' (ReLU) before the first layer with parameters",
        ),
        (lambda: nn.Sequential(nn.Flatten(), nn.Dropout(), nn.Linear(4, 2)), "'1' (Dropout)"),
        (lambda: nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 2)), "'0', is a Embedding"),
        (lambda: nn.Sequential(nn.Conv1d(2, 2, 1), nn.Flatten()), "is a Conv1d"),
        (lambda: nn.Sequential(nn.Conv2d(2, 4, 1, groups=2), nn.Flatten()), "grouped Conv2d (groups=2)"),
        (lambda: nn.Sequential(nn.BatchNorm1d(4, affine=False), nn.Linear(4, 2)), "'0' (BatchNorm1d)"),
        (lambda: nn.Sequential(nn.Sequential(nn.Flatten(), nn.ReLU()), nn.Linear(4, 2)), "'0.1' (ReLU)"),
        (lambda: ScaledSequential(nn.Linear(4, 2)), "overrides nn.Sequential.forward"),
        (
            lambda: nn.Sequential(ScaledSequential(nn.Linear(4, 2))),
            "nested Sequential '0' (ScaledSequential)",
        ),
        (lambda: nn.Sequential(nn.Flatten()), "no layer with parameters"),
        (lambda: SkipNet(), "SkipNet is not an nn.Sequential"),
    ],
)
def test_split_refusals(build: Callable[[], nn.Module], reason: str) -> None:
    model = build()
    split, why = split_stem(model, params_of(model))
    assert split is None and reason in why


def test_split_refuses_shared_weights_hooks_and_parametrizations() -> None:
    lin = nn.Linear(4, 4)
    shared = nn.Sequential(lin, nn.ReLU(), lin)
    assert split_stem(shared, params_of(shared)) == (None, "the model shares parameters between layers")
    hooked = nn.Sequential(nn.Linear(4, 2))
    hooked.register_forward_hook(lambda *_: None)
    assert "the model has forward hooks" in split_stem(hooked, params_of(hooked))[1]
    stem_hooked = nn.Sequential(nn.Linear(4, 2))
    stem_hooked[0].register_forward_pre_hook(lambda *_: None)
    assert "'0' has forward hooks" in split_stem(stem_hooked, params_of(stem_hooked))[1]
    normed = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(4, 2)))
    assert "is a ParametrizedLinear" in split_stem(normed, params_of(normed))[1]


# --------------------------------------------------------------------------- (c) BatchNorm


def _bn_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def _bn_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 5, stride=3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
    )


@pytest.mark.parametrize("build", [_bn_mlp, _bn_cnn])
def test_batchnorm_round(
    data: Data, build: Callable[[], nn.Module], caplog: pytest.LogCaptureFixture
) -> None:
    x_tr, y_tr, x, y = data
    trainer = _seeded(8, build).float()
    start = params_of(trainer)
    counts = [24, 40, 64]
    deltas, offset = [], 0
    for i, n in enumerate(counts):
        deltas.append(
            local_update(
                trainer,
                start,
                x_tr[offset : offset + n],
                y_tr[offset : offset + n],
                TrainConfig(batch_size=8, lr=0.1),
                seed=i,
            )
        )
        offset += n
    bn = [name for name in start if "running" in name]
    assert len(bn) == 2 and all(d.keys() == start.keys() for d in deltas)  # no num_batches_tracked
    assert all(float(d[k].abs().max()) > 0 for d in deltas for k in bn)
    avg = fedavg(deltas, counts)
    for k in bn:
        expected = sum(c * d[k].double() for c, d in zip(counts, deltas, strict=True)) / sum(counts)
        torch.testing.assert_close(avg[k].double(), expected, rtol=0, atol=1e-6)

    model = build().double()  # float64 from here on: modes agree to rounding, accuracy exactly
    g = {k: v.double() for k, v in start.items()}
    deltas64 = [{k: v.double() for k, v in d.items()} for d in deltas]
    with caplog.at_level(logging.INFO, logger="fedsv.valuation.round.round_game"):
        _check_modes(model, g, deltas64, counts, x, y, {mode: mode for mode in MODES})
    assert "head by vmap" in caplog.text  # BatchNorm is no layer of the stacked executor
    # The buffers matter: the grand coalition with w_t's running statistics scores differently.
    members = np.ones((1, 3), dtype=bool)
    grand = RoundGame(model, g, deltas64, counts, x, y, metric="neg_loss").utilities(members)[0]
    frozen = [{k: torch.zeros_like(v) if k in bn else v for k, v in d.items()} for d in deltas64]
    assert (
        abs(RoundGame(model, g, frozen, counts, x, y, metric="neg_loss").utilities(members)[0] - grand) > 1e-6
    )
    with pytest.raises(ValueError, match="unexpected"):
        RoundGame(
            model,
            g,
            [{**d, bn[0].replace("running_mean", "num_batches_tracked"): torch.ones(())} for d in deltas64],
            counts,
            x,
            y,
        )


# --------------------------------------------------------------------------- (d) callable metrics


def test_callable_metric(data: Data) -> None:
    _, _, x, y = data
    model = _seeded(9, lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 24), nn.ReLU(), nn.Linear(24, 10)))
    g, deltas = _random_round(model)
    counts = [2, 3, 4]
    members = all_coalitions(3)

    def margin(logits: Tensor, labels: Tensor) -> Tensor:
        """Logit of the true class minus the best other logit (per sample)."""
        true = logits.gather(1, labels[:, None])[:, 0]
        others = logits.scatter(1, labels[:, None], float("-inf")).max(dim=1).values
        return true - others

    expected_margin = _hand_utilities(model, g, deltas, counts, x, y, margin)
    for mode in MODES:

        def game(metric: Metric, mode: str = mode) -> RoundGame:
            return RoundGame(model, g, deltas, counts, x, y, metric=metric, mode=mode)

        np.testing.assert_array_equal(game(_accuracy).utilities(members), game("accuracy").utilities(members))
        np.testing.assert_allclose(
            game(_neg_loss).utilities(members), game("neg_loss").utilities(members), rtol=0, atol=1e-12
        )
        margin_game = game(margin)
        assert margin_game.mode == mode
        np.testing.assert_allclose(margin_game.utilities(members), expected_margin, rtol=0, atol=1e-10)
    assert len(set(expected_margin.tolist())) == len(expected_margin)

    with pytest.raises(ValueError, match=r"one score per sample, shape \(100,\); got \(\)"):
        RoundGame(model, g, deltas, counts, x, y, metric=lambda lg, lb: _neg_loss(lg, lb).mean()).utility(1)

    def not_a_tensor(logits: Tensor, labels: Tensor) -> float:
        return 1.0

    with pytest.raises(ValueError, match=r"one score per sample.*got float"):
        RoundGame(model, g, deltas, counts, x, y, metric=not_a_tensor).utility(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="metric must be a name"):
        RoundGame(model, g, deltas, counts, x, y, metric=3)  # type: ignore[arg-type]


class DirectWeight(nn.Module):
    """Uses a parameter directly (no layer) before any layer."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x @ self.w)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.fc(x) + y


class HookedInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.fc.register_forward_hook(lambda *_: None)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x)


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (DirectWeight, "the forward reads 'w' directly before any layer with parameters"),
        (TwoInputs, "the forward takes 2 inputs, not one"),
        (HookedInside, "module 'fc' has forward hooks, which a trace would skip"),
        (
            lambda: nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2)),
            "traced, the first layer with parameters, '0', is a BatchNorm1d",
        ),
    ],
)
def test_traced_split_refusals(build: Callable[[], nn.Module], reason: str) -> None:
    model = build()
    split, why = find_stem(model, params_of(model), torch.randn(2, 4))
    assert split is None and reason in why


def test_the_executor_choice_is_logged_at_info_once_per_model(
    data: Data, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, x, y = data
    model = _seeded(4, SkipNet)
    g, deltas = _random_round(model)
    with caplog.at_level(logging.DEBUG, logger="fedsv.valuation.round.round_game"):
        for _ in range(3):
            RoundGame(model, g, deltas, [1, 1, 1], x, y)
    levels = [r.levelname for r in caplog.records if "RoundGame mode 'fast'" in r.getMessage()]
    assert levels == ["INFO", "DEBUG", "DEBUG"]
