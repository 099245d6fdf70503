"""The one place a round game's executor is chosen: the requested mode is a ceiling, probed on the model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedsv.valuation.round.executors import fused_head, stacked_head
from fedsv.valuation.round.executors.base import Executor
from fedsv.valuation.round.executors.compute import Compute, Memory
from fedsv.valuation.round.executors.fast import FastExecutor, FusedHead, Head, StackedHead, VmapHead
from fedsv.valuation.round.executors.stem_split import StemSplit
from fedsv.valuation.round.executors.traced_split import find_stem
from fedsv.valuation.round.executors.whole_model import BatchedExecutor, NaiveExecutor
from fedsv.valuation.round.round_inputs import RoundInputs, coalition_weights

MODES = ("fast", "batched", "naive")

CPU_CONVOLUTIONS = (
    "on the CPU a head of convolutions the stacked executor does not implement runs fastest so "
    "(vmap makes the coalitions' convolutions one grouped convolution: ResNet-18 1.6x slower)"
)
"""Why "fast" runs such a head (a ResNet's residual blocks) one model per coalition on the CPU."""

NAIVE_CPU_CONVOLUTIONS = True
"""Whether "fast" runs a head of convolutions one model per coalition on the CPU (CPU_CONVOLUTIONS);
off, the traced head runs under vmap there as on a GPU (how a test checks that path on a CPU)."""


def _fails(compute: Compute, probe: Callable[[], object]) -> str | None:
    """None if the probe runs, otherwise why not (its exception, shortened)."""
    try:
        with compute.computing():
            probe()
    except Exception as exc:  # any failure of vmap on this model means: do not use it
        message = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {message[:200]}"
    return None


def _stem_split(inputs: RoundInputs, compute: Compute) -> tuple[StemSplit | None, str]:
    """The model's stem split and a description, or None and why there is none."""
    with compute.computing():
        split, found = find_stem(compute.model, inputs.names, inputs.x_val[:2])
    if split is not None and isinstance(split.stem, nn.Conv2d):
        with compute.computing():
            dims = split.prepare(inputs.x_val[:2]).dim()
        if dims != 4:
            return None, f"{found}, but its Conv2d input has {dims} dimensions, not 4"
    return split, found


def plan_executor(
    requested: str, inputs: RoundInputs, compute: Compute, memory: Memory, fused: bool = True
) -> tuple[Executor, str]:
    """The executor of a round game and why: "fast" falls back to "batched" for a model without a stem
    split (or whose head fails under vmap, or under a coordinate-wise rule), and to "naive" on the CPU
    for a head of convolutions the stacked executor does not implement; "batched" falls back to "naive"
    when vmap fails on the model. `fused` allows the fused head kernel where it applies."""
    if requested not in MODES:
        raise ValueError(f"unknown mode {requested!r}; choose one of {list(MODES)}")
    probe = torch.zeros((2, inputs.m), dtype=inputs.weights.dtype, device=compute.device)
    probe[1] = coalition_weights(np.ones((1, inputs.m), dtype=bool), inputs)[0]
    x_probe = inputs.x_val[:2]
    why = ""
    if requested == "fast" and inputs.rule.coordinatewise:
        why, requested = f"no fast path: {inputs.rule.name} is not a weighted sum of deltas; ", "batched"
    if requested == "fast":
        split, found = _stem_split(inputs, compute)
        if split is not None:
            head: Head
            if stacked_head.supports(split.head):
                plan = (
                    fused_head.plan(split.head, compute.device, compute.precision, inputs.metric)
                    if fused
                    else None
                )
                head = (
                    StackedHead(split, inputs, compute)
                    if plan is None
                    else FusedHead(split, inputs, compute, plan)
                )
                executor = FastExecutor(inputs, compute, memory, split, head)
                return executor, executor.how
            convolutions = any(isinstance(layer, nn.Conv2d) for layer in split.head.modules())
            if convolutions and compute.device.type == "cpu" and NAIVE_CPU_CONVOLUTIONS:
                naive = NaiveExecutor(inputs, compute, memory)
                return naive, f"{found}; {naive.how}: {CPU_CONVOLUTIONS}"
            vmapped = VmapHead(split, inputs, compute)
            executor = FastExecutor(inputs, compute, memory, split, vmapped)
            failure = _fails(compute, lambda: vmapped.logits(probe, *executor.stems.compute_chunk(x_probe)))
            if failure is None:
                return executor, executor.how
            found = f"{found}, but its head fails under vmap ({failure})"
        why, requested = f"no fast path: {found}; ", "batched"
    if requested == "batched":
        batched = BatchedExecutor(inputs, compute, memory)
        failure = _fails(compute, lambda: batched.logits(probe, x_probe))
        if failure is None:
            return batched, f"{why}{batched.how}"
        return NaiveExecutor(
            inputs, compute, memory
        ), f"{why}vmap over the model fails ({failure}); one model per coalition"
    return NaiveExecutor(inputs, compute, memory), "one model per coalition, as requested"
