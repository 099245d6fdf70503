"""Local SGD training of a participant (returns the model delta), evaluation and FedAvg aggregation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedsv.valuation.round_inputs import federated_state

ArrayOrTensor = np.ndarray | Tensor


class BatchTransform(Protocol):
    """Changes a training batch before the step (e.g. a participant's backdoor poisoning)."""

    def transform_batch(
        self, xb: Tensor, yb: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class TrainConfig:
    """Local training hyper-parameters of a participant (plain SGD by default, as in FedAvg)."""

    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


def to_tensors(x: ArrayOrTensor, y: ArrayOrTensor) -> tuple[Tensor, Tensor]:
    """(float32 images, int64 labels) as tensors, sharing memory with numpy inputs where possible."""
    xt = torch.as_tensor(x, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.int64)
    if yt.ndim != 1 or xt.shape[0] != yt.shape[0]:
        raise ValueError(
            f"need images (n, ...) and labels (n,), got shapes {tuple(xt.shape)} and {tuple(yt.shape)}"
        )
    return xt, yt


def params_of(model: nn.Module) -> dict[str, Tensor]:
    """Detached clones of the model's federated state: named parameters and floating-point buffers.

    This is what travels and is averaged: w_t, the deltas (local_update), FedAvg. Buffers go by their
    state_dict names; floating-point ones (BatchNorm's running_mean, running_var) are averaged like
    parameters. Integer buffers (num_batches_tracked) and non-persistent buffers stay local to each
    copy of the model and never travel (fedsv.valuation.round_inputs.federated_state).
    """
    return {name: t.detach().clone() for name, t in federated_state(model).items()}


def _check_keys(what: str, expected: Mapping[str, Tensor], got: Mapping[str, Tensor]) -> None:
    if set(expected) != set(got):
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        raise ValueError(f"{what}: parameter names differ (missing {missing}, unexpected {extra})")


def load_params(model: nn.Module, params: Mapping[str, Tensor]) -> None:
    """Copy `params` into the model's parameters and float buffers in place (names and shapes must match)."""
    own = federated_state(model)
    _check_keys("load_params", own, params)
    with torch.no_grad():
        for name, p in own.items():
            if p.shape != params[name].shape:
                raise ValueError(
                    f"load_params: {name} has shape {tuple(params[name].shape)}, model has {tuple(p.shape)}"
                )
            p.copy_(params[name])


def apply_delta(
    params: Mapping[str, Tensor], delta: Mapping[str, Tensor], scale: float = 1.0
) -> dict[str, Tensor]:
    """params + scale * delta, per tensor (parameters and float buffers; new tensors, inputs untouched)."""
    _check_keys("apply_delta", params, delta)
    return {name: p + scale * delta[name].to(p.dtype) for name, p in params.items()}


def fedavg(deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """Weighted mean of the deltas (weights: the participants' sample counts), accumulated in float64.

    Float buffers in the deltas (BatchNorm running statistics) are averaged exactly like parameters.
    """
    if len(deltas) == 0:
        raise ValueError("fedavg needs at least one delta")
    if len(weights) != len(deltas):
        raise ValueError(f"fedavg got {len(deltas)} deltas but {len(weights)} weights")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"fedavg weights must be >= 0 with a positive sum, got {list(weights)}")
    for i, d in enumerate(deltas[1:], start=1):
        _check_keys(f"fedavg delta {i}", deltas[0], d)
    total = float(sum(weights))
    out: dict[str, Tensor] = {}
    for name, first in deltas[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        for d, w in zip(deltas, weights, strict=True):
            acc += d[name].to(torch.float64) * float(w)
        out[name] = (acc / total).to(first.dtype)
    return out


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def local_update(
    model: nn.Module,
    global_params: Mapping[str, Tensor],
    x: ArrayOrTensor,
    y: ArrayOrTensor,
    config: TrainConfig,
    seed: int,
    corruption: BatchTransform | None = None,
) -> dict[str, Tensor]:
    """Train from global_params on (x, y) with SGD and return trained - global per tensor of the state.

    The state is params_of's: named parameters and float buffers (BatchNorm's running statistics
    change in train mode, so their delta is part of the update). `model` is used as scratch space:
    its parameters and buffers are overwritten; its integer buffers keep counting locally.
    Mini-batch order, dropout and backdoor poisoning are all seeded from `seed` (the caller's global
    torch RNG is left untouched), so the same seed gives a bit-identical delta. Label flipping must
    already be applied to `y`.
    """
    xt, yt = to_tensors(x, y)
    n = len(yt)
    if n == 0:
        raise ValueError("local_update got no training samples; check the participant's partition")
    load_params(model, global_params)
    device = _model_device(model)
    start = params_of(model)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    order_gen = torch.Generator().manual_seed(seed)
    poison_gen = torch.Generator().manual_seed(seed + 0x5EED)
    # Fork the RNG of the device that runs dropout too, so the caller's generators stay untouched.
    rng_devices: list[int] = []
    if device.type == "cuda":
        rng_devices = [device.index if device.index is not None else torch.cuda.current_device()]
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed)
            for _ in range(config.epochs):
                order = torch.randperm(n, generator=order_gen)
                for lo in range(0, n, config.batch_size):
                    idx = order[lo : lo + config.batch_size]
                    xb, yb = xt[idx], yt[idx]
                    if corruption is not None:
                        xb, yb = corruption.transform_batch(xb, yb, poison_gen)
                    optimizer.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
                    loss.backward()
                    optimizer.step()
    finally:
        model.train(was_training)
    return {name: (t.detach() - start[name]).to(t.dtype) for name, t in federated_state(model).items()}


@torch.no_grad()
def predict(
    model: nn.Module, params: Mapping[str, Tensor] | None, x: ArrayOrTensor, batch_size: int = 1000
) -> Tensor:
    """Logits of the model (eval mode) on x, with `params` (params_of's tensors) substituted if given."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    xt = torch.as_tensor(x, dtype=torch.float32)
    if params is not None:
        _check_keys("predict", federated_state(model), params)
    device = _model_device(model)
    was_training = model.training
    model.eval()
    try:
        outs = []
        for lo in range(0, len(xt), batch_size):
            xb = xt[lo : lo + batch_size].to(device)
            out = model(xb) if params is None else functional_call(model, dict(params), (xb,))
            outs.append(out)
    finally:
        model.train(was_training)
    if not outs:
        raise ValueError("predict got no images")
    return torch.cat(outs)


def evaluate(
    model: nn.Module,
    params: Mapping[str, Tensor] | None,
    x: ArrayOrTensor,
    y: ArrayOrTensor,
    batch_size: int = 1000,
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) on (x, y), optionally with `params` (the model is untouched)."""
    xt, yt = to_tensors(x, y)
    if len(yt) == 0:
        raise ValueError("evaluate got no samples; pass a non-empty evaluation set")
    logits = predict(model, params, xt, batch_size)
    yt = yt.to(logits.device)
    accuracy = (logits.argmax(dim=1) == yt).double().mean().item()
    loss = F.cross_entropy(logits.double(), yt).item()
    return float(accuracy), float(loss)
