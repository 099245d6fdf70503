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


def run_stacked(head: nn.Sequential, param: ParamFn, h: Tensor, first: int = 0) -> Tensor:
    """Forward h (B, n, *features) through the head's layers from index `first` on, in eval mode,
    coalition b using param(...)[b]."""
    b, n = h.shape[:2]
    for index, layer in enumerate(head):
        if index < first:
            continue
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            weight = param(f"{index}.weight")
            bias = param(f"{index}.bias") if layer.bias is not None else None
            h = _linear(h, weight, bias) if isinstance(layer, nn.Linear) else _conv2d(h, layer, weight, bias)
        elif isinstance(layer, nn.ReLU):
            h = torch.relu_(h) if h.is_contiguous() else torch.relu(h)
        elif isinstance(layer, nn.MaxPool2d):
            pooled = F.max_pool2d(
                h.reshape(b * n, *h.shape[2:]),
                layer.kernel_size,
                layer.stride,
                layer.padding,
                layer.dilation,
                ceil_mode=layer.ceil_mode,
            )
            h = pooled.reshape(b, n, *pooled.shape[1:])
        elif isinstance(layer, nn.Flatten):
            h = h.reshape(b, n, -1)
        elif isinstance(layer, (nn.Dropout, nn.Dropout2d, nn.Identity)):
            continue  # identity in eval mode
        else:  # pragma: no cover - guarded by supports()
            raise TypeError(f"unsupported layer {type(layer).__name__}")
    return h
