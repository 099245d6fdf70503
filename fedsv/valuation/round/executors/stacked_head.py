"""Run a Sequential head for B coalitions at once, each with its own parameters (batched matmul)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ParamFn = Callable[[str], Tensor]
"""Maps a parameter name relative to the head (e.g. "1.weight") to its (B, *shape) stack."""

_STATELESS = (nn.ReLU, nn.Flatten, nn.Dropout, nn.Dropout2d, nn.MaxPool2d, nn.Identity)


def supports(head: nn.Module) -> bool:
    """True if every layer of the head is one the stacked executor implements.

    Layers must be exactly the known classes (a subclass may override forward) with nothing attached:
    no forward hooks (the executor never calls the layer) and no parametrizations.
    """
    if not isinstance(head, nn.Sequential) or type(head).forward is not nn.Sequential.forward:
        return False
    for layer in head:
        if type(layer) not in (nn.Linear, nn.Conv2d, *_STATELESS):
            return False
        if layer._forward_hooks or layer._forward_pre_hooks:
            return False
        if isinstance(layer, nn.Flatten) and (layer.start_dim != 1 or layer.end_dim != -1):
            return False
        if isinstance(layer, nn.Conv2d) and (layer.padding_mode != "zeros" or isinstance(layer.padding, str)):
            return False
    return True


def _linear(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """h (B, n, in) with weight (B, out, in), bias (B, out) -> (B, n, out)."""
    if bias is None:
        return torch.bmm(h, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))


def _conv2d(h: Tensor, layer: nn.Conv2d, weight: Tensor, bias: Tensor | None) -> Tensor:
    """h (B, n, C, H, W) with per-coalition weights (B, out, C/g, k, k) -> (B, n, out, H', W').

    On CUDA one grouped convolution for all B coalitions (cuDNN runs it as B independent ones, in one
    launch); on the CPU one ordinary convolution per coalition, which CPU backends run far faster than
    the equivalent grouped one with B groups.
    """
    if h.is_cuda:
        b, n = h.shape[:2]
        merged = h.transpose(0, 1).reshape(n, b * h.shape[2], *h.shape[3:])  # (n, B*C, H, W)
        out = F.conv2d(
            merged,
            weight.reshape(-1, *weight.shape[2:]),
            None if bias is None else bias.reshape(-1),
            stride=layer.stride,
            padding=layer.padding,
            dilation=layer.dilation,
            groups=layer.groups * b,
        )
        return out.reshape(n, b, -1, *out.shape[2:]).transpose(0, 1)
    outs = [
        F.conv2d(
            h[b],
            weight[b],
            None if bias is None else bias[b],
            stride=layer.stride,
            padding=layer.padding,
            dilation=layer.dilation,
            groups=layer.groups,
        )
        for b in range(h.shape[0])
    ]
    return torch.stack(outs)


def _pairs(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[-1]))


def max_pool(h: Tensor, layer: nn.MaxPool2d) -> Tensor:
    """layer's pooling of h (N, C, H, W), equal to F.max_pool2d's. Windows that tile the image (stride
    equal to the kernel, no padding, dilation or ceil mode) take the elementwise maximum of the k*k
    strided views: on the CPU 5-10x faster than max_pool2d, which also computes the indices."""
    kernel = _pairs(layer.kernel_size)
    stride = _pairs(layer.stride if layer.stride is not None else layer.kernel_size)
    tiles = (
        stride == kernel
        and _pairs(layer.padding) == (0, 0)
        and _pairs(layer.dilation) == (1, 1)
        and not layer.ceil_mode
        and not layer.return_indices
    )
    if not tiles:
        return F.max_pool2d(
            h, layer.kernel_size, layer.stride, layer.padding, layer.dilation, ceil_mode=layer.ceil_mode
        )
    (kh, kw), height, width = kernel, h.shape[-2] // kernel[0], h.shape[-1] // kernel[1]
    pooled: Tensor | None = None
    for i in range(kh):
        for j in range(kw):
            view = h[..., i : height * kh : kh, j : width * kw : kw]
            pooled = view if pooled is None else torch.maximum(pooled, view)
    assert pooled is not None
    return pooled.contiguous()


def run_stacked(head: nn.Sequential, param: ParamFn, h: Tensor, first: int = 0) -> Tensor:
    """Forward h (B, n, *features) through the head's layers from index `first` on, in eval mode,
    coalition b using param(...)[b]. A ReLU just before a max pooling runs after it (the two commute:
    the same numbers, on a quarter of the activations for 2x2 windows)."""
    b, n = h.shape[:2]
    layers = list(head)
    relu_after_pool = False
    for index, layer in enumerate(layers):
        if index < first:
            continue
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            weight = param(f"{index}.weight")
            bias = param(f"{index}.bias") if layer.bias is not None else None
            h = _linear(h, weight, bias) if isinstance(layer, nn.Linear) else _conv2d(h, layer, weight, bias)
        elif isinstance(layer, nn.ReLU):
            if index + 1 < len(layers) and isinstance(layers[index + 1], nn.MaxPool2d):
                relu_after_pool = True
                continue
            h = torch.relu_(h) if h.is_contiguous() else torch.relu(h)
        elif isinstance(layer, nn.MaxPool2d):
            pooled = max_pool(h.reshape(b * n, *h.shape[2:]), layer)
            h = pooled.reshape(b, n, *pooled.shape[1:])
            if relu_after_pool:
                h, relu_after_pool = torch.relu_(h), False
        elif isinstance(layer, nn.Flatten):
            h = h.reshape(b, n, -1)
        elif isinstance(layer, (nn.Dropout, nn.Dropout2d, nn.Identity)):
            continue  # identity in eval mode
        else:  # pragma: no cover - guarded by supports()
            raise TypeError(f"unsupported layer {type(layer).__name__}")
    return h
