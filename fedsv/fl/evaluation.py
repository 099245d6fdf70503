"""Scoring a model on a labelled set: EvalSet, logits with substituted parameters, accuracy and loss."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedsv.fl.state import check_names, federated_state, model_device

ArrayOrTensor = np.ndarray | Tensor


@dataclass(frozen=True)
class EvalSet:
    """Features and labels a model is scored on (the coordinator's validation or test split)."""

    x: np.ndarray | Tensor
    y: np.ndarray | Tensor


def to_tensors(x: ArrayOrTensor, y: ArrayOrTensor) -> tuple[Tensor, Tensor]:
    """(float32 images, int64 labels) as tensors, sharing memory with numpy inputs where possible."""
    xt = torch.as_tensor(x, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.int64)
    if yt.ndim != 1 or xt.shape[0] != yt.shape[0]:
        raise ValueError(
            f"need images (n, ...) and labels (n,), got shapes {tuple(xt.shape)} and {tuple(yt.shape)}"
        )
    return xt, yt


@torch.no_grad()
def predict(
    model: nn.Module, params: Mapping[str, Tensor] | None, x: ArrayOrTensor, batch_size: int = 1000
) -> Tensor:
    """Logits of the model (eval mode) on x, with `params` (params_of's tensors) substituted if given."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    xt = torch.as_tensor(x, dtype=torch.float32)
    if params is not None:
        check_names("predict", federated_state(model), params)
    device = model_device(model)
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


def validation_descent(
    model: nn.Module, params: Mapping[str, Tensor], validation: EvalSet, batch_size: int = 1000
) -> dict[str, Tensor]:
    """-grad of the mean cross-entropy on `validation` at `params`, per trainable parameter (eval mode:
    running statistics, no dropout); the model's own weights and mode are untouched."""
    xt, yt = to_tensors(validation.x, validation.y)
    device = model_device(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    leaves = {
        name: t.detach().to(device).requires_grad_(name in trainable and t.is_floating_point())
        for name, t in params.items()
    }
    was_training = model.training
    model.eval()
    try:
        for lo in range(0, len(yt), batch_size):
            xb, yb = xt[lo : lo + batch_size].to(device), yt[lo : lo + batch_size].to(device)
            logits = functional_call(model, leaves, (xb,))
            (F.cross_entropy(logits.double(), yb, reduction="sum") / len(yt)).backward()
    finally:
        model.train(was_training)
    return {
        name: -leaf.grad.detach() if leaf.grad is not None else torch.zeros_like(leaf)
        for name, leaf in leaves.items()
        if leaf.requires_grad
    }
