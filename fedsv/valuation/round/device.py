"""How precisely and in how much memory a round's game computes: TF32 switches, memory budgets."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

PRECISIONS = ("fp32", "tf32", "bf16")

DEFAULT_BUDGET_MB = 256.0
"""Memory budget of a game on the CPU when the caller gives none, in MiB."""

CUDA_BUDGET_FRACTION = 0.25
"""A CUDA game left at the default budget may use this fraction of the device's free memory."""

DEFAULT_WORKING_SET = 2**20
"""Floats of activations per step of a matmul head on the CPU (cache-sized); a CUDA game uses more."""


@contextmanager
def tf32_allowed(allow: bool) -> Iterator[None]:
    """CUDA float32 matmuls and cuDNN convolutions may use TF32 iff allow; the settings come back after.

    Set with the allow_tf32 flags, or with fp32_precision where the process already uses that newer API
    (torch refuses to read the old flags then); restored exactly, as fp32_precision strings. The
    settings are process-wide: other threads' CUDA work sees them while the game evaluates.
    """
    matmul = torch.backends.cuda.matmul
    cudnn: Any = torch.backends.cudnn  # conv, rnn and fp32_precision are set at run time, unknown to mypy
    saved = (matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision)
    try:
        legacy: tuple[bool, bool] | None = (matmul.allow_tf32, cudnn.allow_tf32)
    except RuntimeError:  # "mix of the legacy and new APIs": keep to the new one
        legacy = None
    if legacy is not None:
        matmul.allow_tf32, cudnn.allow_tf32 = allow, allow
    else:
        matmul.fp32_precision = cudnn.conv.fp32_precision = "tf32" if allow else "ieee"
    try:
        yield
    finally:
        if legacy is not None:
            matmul.allow_tf32, cudnn.allow_tf32 = legacy
        matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = saved


def lives_on(model: nn.Module, device: torch.device) -> bool:
    """True if every parameter and buffer of the model is on the device."""
    return all(t.device == device for t in itertools.chain(model.parameters(), model.buffers()))


def default_budget_mb(device: torch.device) -> float:
    """DEFAULT_BUDGET_MB on the CPU; CUDA_BUDGET_FRACTION of the free memory of a CUDA device."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(1.0, CUDA_BUDGET_FRACTION * free / 2**20)
    return DEFAULT_BUDGET_MB
