"""A model's federated state (parameters and float buffers) and the arithmetic of rounds on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn


def federated_state(model: nn.Module) -> dict[str, Tensor]:
    """The tensors a round moves: named parameters and floating-point buffers, by state_dict name.

    Integer buffers (BatchNorm's num_batches_tracked) and non-persistent buffers stay with each copy of
    the model. fedsv.task.training.params_of follows the same rule.
    """
    persistent = model.state_dict(keep_vars=True)
    state: dict[str, Tensor] = dict(model.named_parameters())
    for name, buffer in model.named_buffers():
        if buffer.is_floating_point() and name in persistent:
            state[name] = buffer
    return state


def params_of(model: nn.Module) -> dict[str, Tensor]:
    """Detached clones of the model's federated state: named parameters and floating-point buffers.

    This is what travels and is averaged: w_t, the deltas (local_update), FedAvg. Buffers go by their
    state_dict names; floating-point ones (BatchNorm's running_mean, running_var) are averaged like
    parameters. Integer buffers (num_batches_tracked) and non-persistent buffers stay local to each
    copy of the model and never travel (fedsv.valuation.round.round_inputs.federated_state).
    """
    return {name: t.detach().clone() for name, t in federated_state(model).items()}


def check_names(what: str, expected: Mapping[str, Tensor], got: Mapping[str, Tensor]) -> None:
    if set(expected) != set(got):
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        raise ValueError(f"{what}: parameter names differ (missing {missing}, unexpected {extra})")


def load_params(model: nn.Module, params: Mapping[str, Tensor]) -> None:
    """Copy `params` into the model's parameters and float buffers in place (names and shapes must match)."""
    own = federated_state(model)
    check_names("load_params", own, params)
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
    check_names("apply_delta", params, delta)
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
        check_names(f"fedavg delta {i}", deltas[0], d)
    total = float(sum(weights))
    out: dict[str, Tensor] = {}
    for name, first in deltas[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        for d, w in zip(deltas, weights, strict=True):
            acc += d[name].to(torch.float64) * float(w)
        out[name] = (acc / total).to(first.dtype)
    return out


def model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
