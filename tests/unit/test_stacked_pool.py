"""The stacked head's max pooling equals torch's for every pooling layer, tiling or not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsv.valuation.round.executors.stacked_head import max_pool, run_stacked

LAYERS = [
    nn.MaxPool2d(2),
    nn.MaxPool2d(3),  # 13 x 13: the last row and column are dropped, as max_pool2d drops them
    nn.MaxPool2d((2, 3)),
    nn.MaxPool2d(3, stride=2),  # overlapping windows: torch's own pooling
    nn.MaxPool2d(2, padding=1),
    nn.MaxPool2d(2, ceil_mode=True),
    nn.MaxPool2d(2, dilation=2),
]


@pytest.mark.parametrize("layer", LAYERS, ids=repr)
@pytest.mark.parametrize("size", [12, 13])
def test_max_pool_equals_torch(layer: nn.MaxPool2d, size: int) -> None:
    h = torch.randn(5, 3, size, size, generator=torch.Generator().manual_seed(size))
    h[0, 0, 0, 0], h[1, 1, 2, 3], h[2, 2, 5, 5] = float("nan"), float("inf"), float("-inf")
    assert torch.equal(max_pool(h, layer).nan_to_num(7.0), layer(h).nan_to_num(7.0))


def test_relu_before_pool_runs_after_it_with_the_same_numbers() -> None:
    """A Conv-ReLU-MaxPool head (CifarCNN's) run stacked for 3 coalitions equals each one's forward."""
    torch.manual_seed(0)
    head = nn.Sequential(
        nn.Conv2d(4, 6, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 5 * 5, 3)
    )
    weights = [{k: v + 0.1 * torch.randn_like(v) for k, v in head.state_dict().items()} for _ in range(3)]
    h = torch.randn(3, 7, 4, 12, 12)
    before = h.clone()
    stacked = run_stacked(head, lambda name: torch.stack([w[name] for w in weights]), h)
    for b, w in enumerate(weights):
        one = torch.func.functional_call(head, w, (h[b],))
        torch.testing.assert_close(stacked[b], one, rtol=0, atol=1e-6)
    assert not torch.equal(stacked[0], stacked[1])
    assert torch.equal(h, before)  # the input is not changed in place
