"""The fused MLP-head kernel: where it applies, and on CUDA that it scores like the layer-by-layer head."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedsv.task.models import build_model
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.round.executors import fused_head
from fedsv.valuation.round.executors.fast import FusedHead
from fedsv.valuation.round.round_inputs import by_cell
from tests.support.round_games import fast_executor

REPO = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
TRITON = importlib.util.find_spec("triton") is not None
needs_kernel = pytest.mark.skipif(not (CUDA and TRITON), reason="needs a CUDA device and Triton")


def mlp_head(classes: int = 10, bias: bool = True) -> nn.Sequential:
    return nn.Sequential(
        nn.ReLU(), nn.Linear(20, 30, bias=bias), nn.Dropout(), nn.ReLU(), nn.Linear(30, classes)
    )


@pytest.fixture
def kernel_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan as if Triton were importable (the shape rules are checked without a GPU)."""
    monkeypatch.setattr(fused_head, "_load_kernel", lambda: object())


def test_plan_takes_relu_linear_relu_linear_with_biases(kernel_present: None) -> None:
    cuda = torch.device("cuda")
    plan = fused_head.plan(mlp_head(), cuda, "tf32", "accuracy")
    assert plan == fused_head.FusedMLPHead("1.weight", "1.bias", "4.weight", "4.bias", 10)


@pytest.mark.parametrize(
    ("head", "device", "precision", "metric"),
    [
        (mlp_head(), "cpu", "fp32", "accuracy"),  # CUDA only
        (mlp_head(), "cuda", "bf16", "accuracy"),  # autocast semantics: the layer-by-layer head
        (mlp_head(), "cuda", "fp32", "accuracy"),  # IEEE products: cuBLAS is faster than Triton's dot
        (mlp_head(), "cuda", "tf32", "neg_loss"),  # accuracy only
        (mlp_head(bias=False), "cuda", "tf32", "accuracy"),
        (mlp_head(classes=fused_head.MAX_CLASSES + 1), "cuda", "tf32", "accuracy"),
        (nn.Sequential(nn.ReLU(), nn.Linear(20, 10)), "cuda", "tf32", "accuracy"),
        (
            nn.Sequential(nn.Tanh(), nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 10)),
            "cuda",
            "tf32",
            "accuracy",
        ),
    ],
)
def test_plan_refuses_what_the_kernel_does_not_compute(
    kernel_present: None, head: nn.Module, device: str, precision: str, metric: str
) -> None:
    assert fused_head.plan(head, torch.device(device), precision, metric) is None


def test_without_triton_cuda_games_use_the_layer_by_layer_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_head, "_load_kernel", lambda: None)
    assert fused_head.plan(mlp_head(), torch.device("cuda"), "tf32", "accuracy") is None


@needs_kernel
@pytest.mark.parametrize(
    ("n", "d1", "d2", "classes"), [(1000, 200, 200, 10), (70, 40, 72, 3), (5, 16, 16, 16)]
)
def test_kernel_counts_like_torch(n: int, d1: int, d2: int, classes: int) -> None:
    """Random inputs of awkward sizes (not multiples of the blocks), IEEE products: the same argmax."""
    gen = torch.Generator(device="cuda").manual_seed(n)
    batch = 7

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=gen)

    h1 = torch.relu(rand(batch, n, d1))
    params = {"1.weight": rand(batch, d2, d1) / d1**0.5, "1.bias": rand(batch, d2) * 0.1}
    params |= {"3.weight": rand(batch, classes, d2) / d2**0.5, "3.bias": rand(batch, classes) * 0.1}
    y = torch.randint(0, classes, (n,), device="cuda", generator=gen)
    plan = fused_head.FusedMLPHead("1.weight", "1.bias", "3.weight", "3.bias", classes)
    p64 = {k: v.double() for k, v in params.items()}
    hidden = torch.relu(torch.baddbmm(p64["1.bias"][:, None], h1.double(), p64["1.weight"].mT))
    logits = torch.baddbmm(p64["3.bias"][:, None], hidden, p64["3.weight"].mT)
    folds = 2  # (label, fold) cells, as a game's validation folds split the scores
    cells = y * folds + torch.randint(0, folds, (n,), device="cuda", generator=gen)
    expected = by_cell((logits.argmax(-1) == y).double(), cells, classes * folds).long()
    got = fused_head.correct_counts(plan, h1, params, y, "tf32", cells, classes * folds)
    # TF32 products against float64: an argmax may differ only where two logits tie within TF32's
    # rounding (about 1e-3 relative), a few samples in a thousand.
    assert torch.all((got.long() - expected).abs().sum(dim=1) <= max(2, n // 50)), (got, expected)


@needs_kernel
def test_fused_game_matches_the_layer_by_layer_game() -> None:
    precision = "tf32"
    torch.manual_seed(0)
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    deltas = [{k: 0.05 * torch.randn_like(v) for k, v in params.items()} for _ in range(8)]
    x, y = torch.rand(500, 1, 28, 28), torch.randint(0, 10, (500,))

    def game(fused: bool) -> RoundGame:
        return RoundGame(
            model, params, deltas, [10] * 8, x, y, device="cuda", precision=precision, fused=fused
        )

    fused, plain = game(True), game(False)
    assert isinstance(fast_executor(fused).head, FusedHead)
    assert not isinstance(fast_executor(plain).head, FusedHead)
    a, b = ExactShapley().run(fused), ExactShapley().run(plain)
    table_a, table_b = fused.dense_table(), plain.dense_table()
    assert table_a is not None and table_b is not None
    flips = np.rint(np.abs(table_a - table_b) * 500)
    assert flips.max() <= 2 and np.mean(flips > 0) <= 0.1
    np.testing.assert_allclose(a.values, b.values, atol=2e-3)
