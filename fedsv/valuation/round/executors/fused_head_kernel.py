"""The Triton kernel of fused_head: a tile of a coalition's samples through ReLU-Linear-ReLU-Linear-argmax."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mlp_head_accuracy(
    H,  # (B, n, D1) ReLU'd stem sums of each coalition
    W2,  # (B, D2, D1) hidden Linear weight of each coalition
    B2,  # (B, D2)
    W3,  # (B, C, D2) output Linear weight of each coalition
    B3,  # (B, C)
    Y,  # (n,) int32 labels
    CELLS,  # (n,) int32 each sample's column of OUT (its label, or its (label, fold) cell)
    OUT,  # (B, W) int32 correct predictions per cell, accumulated
    n,
    W,  # cells per coalition
    D1: tl.constexpr,  # layer sizes are compile-time: the block loops unroll (one compile per model)
    D2: tl.constexpr,
    C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n
    cls = tl.arange(0, BLOCK_C)
    cls_ok = cls < C
    h_base = H + b * n * D1
    w2_base = W2 + b * D2 * D1
    w3_base = W3 + b * C * D2
    logits = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
    for o0 in tl.static_range(0, D2, BLOCK_O):
        outs = o0 + tl.arange(0, BLOCK_O)
        out_ok = outs < D2
        acc = tl.zeros((BLOCK_N, BLOCK_O), dtype=tl.float32)
        for k0 in tl.static_range(0, D1, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < D1
            a = tl.load(
                h_base + rows[:, None] * D1 + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            w = tl.load(
                w2_base + outs[None, :] * D1 + ks[:, None], mask=k_ok[:, None] & out_ok[None, :], other=0.0
            )
            acc += tl.dot(a, w, input_precision=PRECISION)
        bias = tl.load(B2 + b * D2 + outs, mask=out_ok, other=0.0)
        z = tl.maximum(acc + bias[None, :], 0.0)
        w3 = tl.load(
            w3_base + cls[None, :] * D2 + outs[:, None], mask=out_ok[:, None] & cls_ok[None, :], other=0.0
        )
        logits += tl.dot(z, w3, input_precision=PRECISION)
    logits += tl.load(B3 + b * C + cls, mask=cls_ok, other=0.0)[None, :]
    logits = tl.where(cls_ok[None, :], logits, float("-inf"))
    pred = tl.argmax(logits, axis=1, tie_break_left=True)
    y = tl.load(Y + rows, mask=row_ok, other=0)
    correct = ((pred == y) & row_ok).to(tl.int32)
    cell = tl.load(CELLS + rows, mask=row_ok, other=0)
    tl.atomic_add(OUT + b * W + cell, correct, mask=row_ok)


__all__ = ["mlp_head_accuracy", "triton"]
