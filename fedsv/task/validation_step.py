"""The guard's trusted step for a round: the coordinator's validation set trained from w_t as the run's
members train (the task's own train, or seeded SGD with the run's epochs, batch size and learning rate)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.data.sources import Samples
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.selection import train_seed
from fedsv.fl.trusted_step import TrustedStep
from fedsv.task.interface import LoadedTask, TrainContext


@dataclass(frozen=True)
class LocalTraining:
    """How the run's members train locally (the settings the coordinator sends them) and the run's seed."""

    seed: int
    participants: int
    epochs: int
    batch_size: int
    lr: float


def validation_step(
    task: LoadedTask,
    scratch: nn.Module,
    params: Mapping[str, Tensor],
    validation: EvalSet,
    training: LocalTraining,
    round_number: int,
) -> TrustedStep:
    """The round's trusted step, trained when first asked for (once) on `scratch` (a model of the run's
    architecture that nothing else uses meanwhile). Seeded as a rank one past the last member's, so the
    same run gives the same step. The delta of the trainable parameters, on the CPU."""
    trainable = [name for name, p in scratch.named_parameters() if p.requires_grad]
    cached: dict[str, Tensor] = {}

    def step() -> Mapping[str, Tensor]:
        if not cached:
            x, y = (
                t.numpy() if isinstance(t, Tensor) else np.asarray(t) for t in (validation.x, validation.y)
            )
            samples = Samples(x.astype(np.float32, copy=False), y.astype(np.int64, copy=False), "validation")
            rank = training.participants
            context = TrainContext(
                round=round_number, rank=rank, seed=train_seed(training.seed, round_number, rank),
                epochs=training.epochs, batch_size=training.batch_size, lr=training.lr,
            )  # fmt: skip
            delta = task.local_update(scratch, params, samples, context)
            cached.update({name: delta[name].detach().to("cpu", torch.float64) for name in trainable})
        return cached

    return step
