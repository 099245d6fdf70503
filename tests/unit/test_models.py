"""The paper's models: output shapes, the stem/head split, parameter counts and build_model errors."""

from __future__ import annotations

import pytest
import torch

from fedsv.common.models import CifarCNN, MnistCNN, build_model
from fedsv.common.training import params_of

CASES = [
    ("mlp", (1, 28, 28), 199_210),
    ("cnn_mnist", (1, 28, 28), 21_840),
    ("cnn_cifar", (3, 32, 32), 878_538),
]


@pytest.mark.parametrize(("name", "shape", "count"), CASES)
def test_forward_split_and_size(name: str, shape: tuple[int, int, int], count: int) -> None:
    model = build_model(name, shape, num_classes=10, seed=0).eval()
    x = torch.rand(5, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(x)
        split = model.head(model.stem(model.prepare(x)))
    assert out.shape == (5, 10)
    assert torch.equal(out, split)
    assert sum(p.numel() for p in model.parameters()) == count
    assert isinstance(model.stem, torch.nn.Linear | torch.nn.Conv2d)
    assert not list(model.buffers())


def test_seeded_init_and_global_rng_untouched() -> None:
    state = torch.random.get_rng_state()
    a = params_of(build_model("mlp", (1, 28, 28), seed=3))
    b = params_of(build_model("mlp", (1, 28, 28), seed=3))
    c = params_of(build_model("mlp", (1, 28, 28), seed=4))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["stem.weight"], c["stem.weight"])


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
