"""Local SGD training of a participant: seeded mini-batch SGD from w_t, returning the model delta."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsv.fl.evaluation import ArrayOrTensor, to_tensors
from fedsv.fl.state import federated_state, load_params, model_device, params_of


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
    device = model_device(model)
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
