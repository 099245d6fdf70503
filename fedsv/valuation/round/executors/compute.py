"""What every executor of a round game shares: the forward passes' contexts, memory, coalition states."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedsv.valuation.round.device import DEFAULT_WORKING_SET, tf32_allowed
from fedsv.valuation.round.round_inputs import RoundInputs


@dataclass(frozen=True)
class Memory:
    """How much an executor may hold: `budget_floats` in all (the stem cache, whole-model batches) and
    `working_set` floats of activations per step of a matmul head."""

    budget_floats: int
    working_set: int

    @classmethod
    def of(cls, device: torch.device, budget_mb: float, working_set_floats: int | None) -> Memory:
        """A budget of `budget_mb` MiB; the working set given, or by default 2**20 floats on the CPU
        (cache-sized) and an eighth of the budget on CUDA."""
        budget_floats = int(budget_mb * 2**20 / 4)
        if working_set_floats is None:
            cuda = device.type == "cuda"
            working_set_floats = max(DEFAULT_WORKING_SET, budget_floats // 8) if cuda else DEFAULT_WORKING_SET
        return cls(budget_floats, max(1, int(working_set_floats)))


class Compute:
    """The model a game evaluates, on its device and in its precision, and the contexts of its passes.

    computing(): eval mode, no autograd, no caller's autocast, and on CUDA the precision's TF32 setting
    (process-wide while it lasts); autocast(): around forward passes, bfloat16 under "bf16";
    exact(): inside a forward pass, parameters combined in the inputs' dtype whatever the precision.
    """

    def __init__(self, model: nn.Module, device: torch.device, precision: str) -> None:
        self.model, self.device, self.precision = model, device, precision

    @contextmanager
    def computing(self) -> Iterator[None]:
        was_training = self.model.training
        self.model.eval()
        tf32 = tf32_allowed(self.precision == "tf32") if self.device.type == "cuda" else nullcontext()
        try:
            with torch.no_grad(), torch.autocast(self.device.type, enabled=False), tf32:
                yield
        finally:
            self.model.train(was_training)

    def autocast(self) -> AbstractContextManager[object]:
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def exact(self) -> AbstractContextManager[object]:
        if self.precision == "bf16":
            return torch.autocast(self.device.type, enabled=False)
        return nullcontext()


def coalition_state(inputs: RoundInputs, name: str, coeffs: Tensor) -> Tensor:
    """One tensor of every coalition in a batch: w_t + coeffs @ deltas, shape (B, *shape).

    For a coordinate-wise rule the coefficients are the membership (coalition_weights), combined by
    the rule instead of a product.
    """
    base = inputs.global_params[name]
    matrix = inputs.delta_matrix(name)
    if inputs.rule.coordinatewise:
        combined = inputs.rule.combine(coeffs > 0, matrix) * inputs.server_lr
        return (base.reshape(1, -1) + combined).reshape(-1, *base.shape)
    flat = torch.addmm(base.reshape(1, -1), coeffs, matrix)
    return flat.reshape(-1, *base.shape)
