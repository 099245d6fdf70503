"""A fused CUDA kernel (Triton) for a linear stem's MLP head scored by accuracy: no activations in memory.

The head after a linear stem of the paper's MLP is ReLU, Linear, ReLU, Linear. Run layer by layer for
a batch of coalitions, every coalition writes and re-reads its (n, hidden) activations several times,
which bounds the engine by memory traffic (docs/performance.md, "Exact FedSV on a GPU"). This kernel
takes the ReLU'd stem sums (B, n, d1) and each coalition's stacked weights, and for a tile of
validation samples of one coalition computes the hidden layer block by block on the tensor cores,
feeds each block straight into the output layer, takes the argmax and adds the tile's correct
predictions to the coalition's total: the hidden layer never leaves the chip.

It is an accelerated special case of RoundGame's stacked head, not a second implementation of the
game: RoundGame uses it only where it computes the same function up to TF32 rounding, as the
layer-by-layer head in TF32 does (CUDA, Triton importable, metric "accuracy", precision "tf32", a
head of exactly that shape with biases); the tests on CUDA compare the two (an image may flip where
two logits tie within TF32's rounding).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

MAX_CLASSES = 128
"""Widest output layer the kernel takes (its logits tile holds every class of a sample)."""

_PRECISION = {"tf32": "tf32"}
"""The game's precision -> the input precision of the kernel's tensor-core products. Only TF32: with
IEEE products Triton's dot runs on the CUDA cores, 30x slower than cuBLAS's FP32 (measured on an H100),
so an "fp32" game keeps the layer-by-layer head."""

TILE = {"BLOCK_N": 128, "BLOCK_O": 64, "BLOCK_K": 64, "num_warps": 8}
"""Samples per program, hidden units per block, reduction block, warps."""

_kernel: Any = None


@dataclass(frozen=True)
class FusedMLPHead:
    """Head parameter names (relative to the head) of the hidden and output Linear layers."""

    hidden_weight: str
    hidden_bias: str
    out_weight: str
    out_bias: str
    classes: int


def shape_of(head: nn.Module) -> FusedMLPHead | None:
    """The head's fused form when it is exactly ReLU-Linear-ReLU-Linear (dropout and identities aside)
    with biases and at most MAX_CLASSES outputs, else None."""
    if not isinstance(head, nn.Sequential):
        return None
    layers = [(i, layer) for i, layer in enumerate(head) if type(layer) not in (nn.Dropout, nn.Identity)]
    kinds = [type(layer) for _, layer in layers]
    if kinds != [nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]:
        return None
    (_, _), (hidden_at, hidden), (_, _), (out_at, out) = layers
    assert isinstance(hidden, nn.Linear) and isinstance(out, nn.Linear)
    if hidden.bias is None or out.bias is None or out.out_features > MAX_CLASSES:
        return None
    return FusedMLPHead(
        f"{hidden_at}.weight", f"{hidden_at}.bias", f"{out_at}.weight", f"{out_at}.bias", out.out_features
    )


def plan(head: nn.Module, device: torch.device, precision: str, metric: object) -> FusedMLPHead | None:
    """The fused head for this game (CUDA, TF32, accuracy, a head of the kernel's shape, Triton
    importable), or None where the kernel does not apply."""
    if device.type != "cuda" or precision not in _PRECISION or metric != "accuracy":
        return None
    fused = shape_of(head)
    if fused is None:
        return None
    if _load_kernel() is None:
        logger.info("no fused head kernel: Triton is not importable; layer-by-layer head")
        return None
    return fused


def correct_counts(
    fused: FusedMLPHead,
    h1: Tensor,
    params: dict[str, Tensor],
    y: Tensor,
    precision: str,
    cells: Tensor | None = None,
    width: int | None = None,
) -> Tensor:
    """Correct predictions per coalition and cell (B, width) int32, from ReLU'd stem sums h1 (B, n, d1)
    and the coalitions' stacked head parameters (name -> (B, *shape)). A sample's cell is its label
    unless `cells` (n,) gives each one's column below `width` (the game's (label, fold) cells): one
    launch over every sample, whatever the folds."""
    kernel = _load_kernel()
    batch, n, d1 = h1.shape
    if cells is None:
        cells, width = y, fused.classes
    if width is None:
        raise ValueError("correct_counts: cells need their width")
    w2 = params[fused.hidden_weight].contiguous()
    b2 = params[fused.hidden_bias].contiguous()
    w3 = params[fused.out_weight].contiguous()
    b3 = params[fused.out_bias].contiguous()
    d2, classes = w2.shape[1], fused.classes
    out = torch.zeros((batch, width), dtype=torch.int32, device=h1.device)
    grid = (batch, (n + TILE["BLOCK_N"] - 1) // TILE["BLOCK_N"])
    kernel[grid](
        h1.contiguous(),
        w2,
        b2,
        w3,
        b3,
        y.to(torch.int32).contiguous(),
        cells.to(torch.int32).contiguous(),
        out,
        n,
        width,
        d1,
        d2,
        classes,
        BLOCK_C=max(16, 1 << (classes - 1).bit_length()),
        PRECISION=_PRECISION[precision],
        **TILE,
    )
    return out


def _load_kernel() -> Any:
    """The Triton kernel, compiled on first use; None when Triton is not importable."""
    global _kernel
    if _kernel is None:
        try:
            from fedsv.valuation.round.executors import fused_head_kernel
        except ImportError:
            return None
        _kernel = fused_head_kernel.mlp_head_accuracy
    return _kernel
