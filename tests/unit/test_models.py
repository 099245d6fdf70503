"""The paper's models: plain Sequentials with a linear first layer, sizes, seeded init, build_model errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedsv.fl.state import params_of
from fedsv.task.models import CifarCNN, MnistCNN, build_model
from fedsv.valuation.round.executors.stem_split import split_stem

CASES = [
    ("mlp", (1, 28, 28), 199_210),
    ("cnn_mnist", (1, 28, 28), 21_840),
    ("cnn_cifar", (3, 32, 32), 878_538),
]

NAMES = {
    "mlp": ["1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"],
    "cnn_mnist": ["0.weight", "0.bias", "3.weight", "3.bias", "8.weight", "8.bias", "11.weight", "11.bias"],
    "cnn_cifar": ["0.weight", "0.bias", "3.weight", "3.bias", "7.weight", "7.bias", "9.weight", "9.bias"],
}


@pytest.mark.parametrize(("name", "shape", "count"), CASES)
def test_forward_split_and_size(name: str, shape: tuple[int, int, int], count: int) -> None:
    model = build_model(name, shape, num_classes=10, seed=0).eval()
    assert isinstance(model, nn.Sequential) and type(model).forward is nn.Sequential.forward
    split, reason = split_stem(model, params_of(model))
    assert split is not None, reason
    x = torch.rand(5, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x)
        split_out = split.head(split.stem(split.prepare(x)))
    assert out.shape == (5, 10)
    assert torch.equal(out, split_out)
    assert sum(p.numel() for p in model.parameters()) == count
    assert isinstance(split.stem, torch.nn.Linear | torch.nn.Conv2d)
    assert split.stem is model[1 if name == "mlp" else 0]
    assert [k for k, _ in model.named_parameters()] == NAMES[name]
    assert not list(model.buffers())


def _paper_layers(name: str, num_classes: int) -> Callable[[], list[nn.Module]]:
    """The paper's parametric layers in the order the models have always created them."""
    if name == "mlp":
        return lambda: [nn.Linear(784, 200), nn.Linear(200, 200), nn.Linear(200, num_classes)]
    if name == "cnn_mnist":
        return lambda: [
            nn.Conv2d(1, 10, 5),
            nn.Conv2d(10, 20, 5),
            nn.Linear(320, 50),
            nn.Linear(50, num_classes),
        ]
    return lambda: [
        nn.Conv2d(3, 32, 5),
        nn.Conv2d(32, 64, 5),
        nn.Linear(1600, 512),
        nn.Linear(512, num_classes),
    ]


@pytest.mark.parametrize(("name", "shape"), [(name, shape) for name, shape, _ in CASES])
def test_initialization_is_the_layer_by_layer_one(name: str, shape: tuple[int, int, int]) -> None:
    """The same seed gives the same weights as creating the paper's layers one by one, in order."""
    for seed in (0, 11):
        model = build_model(name, shape, num_classes=7, seed=seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            reference = [p for layer in _paper_layers(name, 7)() for p in layer.parameters()]
        params = list(model.parameters())
        assert [p.shape for p in params] == [p.shape for p in reference]
        assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))


def test_seeded_init_and_global_rng_untouched() -> None:
    state = torch.random.get_rng_state()
    a = params_of(build_model("mlp", (1, 28, 28), seed=3))
    b = params_of(build_model("mlp", (1, 28, 28), seed=3))
    c = params_of(build_model("mlp", (1, 28, 28), seed=4))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["1.weight"], c["1.weight"])


def test_cnn_alias_and_mlp_input_size() -> None:
    assert isinstance(build_model("cnn", (1, 28, 28)), MnistCNN)
    assert isinstance(build_model("CNN", (3, 32, 32)), CifarCNN)
    mlp = build_model("mlp", (3, 32, 32), num_classes=4)
    assert mlp(torch.zeros(2, 3, 32, 32)).shape == (2, 4)


def test_build_model_errors() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build_model("resnet", (1, 28, 28))
    with pytest.raises(ValueError, match="MnistCNN expects 1x28x28"):
        build_model("cnn_mnist", (3, 32, 32))
    with pytest.raises(ValueError, match="CifarCNN expects 3x32x32"):
        build_model("cnn_cifar", (1, 28, 28))


def test_resnet18_has_its_size_and_every_round_game_mode_gives_its_utilities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ResNet-18 (fedsv.task.resnet): 11.17 M parameters at 3x32x32; on 3x8x8 images (cheap: the pooling
    adapts) the traced fast path (its head under vmap, as on a GPU), "fast" as the CPU runs it (one model
    per coalition), the batched path and a hand-written forward per coalition agree."""
    from fedsv.fl.state import apply_delta, federated_state
    from fedsv.valuation import RoundGame
    from fedsv.valuation.estimators.exact import all_coalitions
    from fedsv.valuation.round.executors import planner
    from fedsv.valuation.round.executors.fast import FastExecutor, VmapHead

    full = build_model("resnet18", (3, 32, 32), seed=0)
    assert sum(p.numel() for p in full.parameters()) == 11_173_962
    model = build_model("resnet18", (3, 8, 8), seed=0).eval()
    generator = torch.Generator().manual_seed(1)
    w = federated_state(model)
    deltas = [{k: 0.05 * torch.randn(v.shape, generator=generator) for k, v in w.items()} for _ in range(3)]
    x = torch.rand(12, 3, 8, 8, generator=generator)
    y = torch.randint(0, 10, (12,), generator=generator)
    members = all_coalitions(3)
    games = {
        mode: RoundGame(model, w, deltas, [1, 2, 3], x, y, metric="neg_loss", mode=mode)
        for mode in ("fast", "batched")
    }
    assert "traced: Conv2d 'conv1'" in games["fast"].computed_by  # the stem is cut off, the rest traced
    # on the CPU a head of residual convolutions runs one model per coalition, faster than under vmap
    assert games["fast"].mode == "naive" and "one model per coalition" in games["fast"].computed_by
    with monkeypatch.context() as patched:  # the traced head under vmap, as a GPU runs it
        patched.setattr(planner, "NAIVE_CPU_CONVOLUTIONS", False)
        traced = RoundGame(model, w, deltas, [1, 2, 3], x, y, metric="neg_loss", mode="fast")
    assert isinstance(traced.executor, FastExecutor) and isinstance(traced.executor.head, VmapHead)
    games["traced"] = traced
    utilities = {mode: game.utilities(members) for mode, game in games.items()}
    naive = []
    for row in members:
        chosen = [i for i in range(3) if row[i]]
        params = w
        if chosen:
            total = float(sum(i + 1 for i in chosen))
            step = {k: torch.zeros_like(v) for k, v in w.items()}
            for i in chosen:
                step = {k: step[k] + deltas[i][k] * ((i + 1) / total) for k in w}
            params = apply_delta(w, step)
        with torch.no_grad():
            logits = torch.func.functional_call(model, params, (x,))
        naive.append(float(torch.log_softmax(logits, 1)[torch.arange(12), y].mean()))
    for mode, got in utilities.items():
        assert got == pytest.approx(naive, abs=1e-4), mode
