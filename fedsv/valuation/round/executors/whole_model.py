"""Modes "batched" (vmap over the whole model, stacked states) and "naive" (one model per coalition)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from fedsv.valuation.round.executors.base import Executor
from fedsv.valuation.round.executors.compute import coalition_state
from fedsv.valuation.round.round_inputs import score_logits


class BatchedExecutor(Executor):
    """Any nn.Module: parameters and float buffers stacked per coalition, the whole forward under vmap
    (integer buffers: the model's own)."""

    mode = "batched"

    @property
    def how(self) -> str:
        return "vmap over the whole model"

    def logits(self, c: Tensor, x: Tensor) -> Tensor:
        """Logits (B, n, classes) of the coalitions with coefficients c on x."""
        model = self.compute.model

        def run(state: dict[str, Tensor], inputs: Tensor) -> Tensor:
            return functional_call(model, state, (inputs,))

        state = {name: coalition_state(self.inputs, name, c) for name in self.inputs.names}
        with self.compute.autocast():
            return vmap(run, in_dims=(0, None))(state, x)

    def totals(self, coeffs: Tensor) -> Tensor:
        x, y, cells = self.inputs.x_val, self.inputs.y_val, self.inputs.cells()
        totals = torch.zeros(
            (coeffs.shape[0], self.inputs.width), dtype=torch.float64, device=self.compute.device
        )
        probe = self.compute.model(x[:1]).numel()
        per_sample = max(probe, int(x[:1].numel()))
        batch = max(1, self.memory.budget_floats // max(1, 3 * x.shape[0] * per_sample))
        for b0 in range(0, coeffs.shape[0], batch):
            c = coeffs[b0 : b0 + batch]
            totals[b0 : b0 + batch] += score_logits(
                self.logits(c, x), y, self.inputs.metric, cells, self.inputs.width
            )
        return totals


NAIVE_CHUNK = 256
"""Validation images per forward pass of one coalition's model: about a training batch's activations."""


class NaiveExecutor(Executor):
    """The straightforward reference: one model rebuilt per coalition, its forward over the validation
    set in chunks of NAIVE_CHUNK images. On the CPU also the fastest way to run a head of convolutions
    that the stacked executor does not implement (planner)."""

    mode = "naive"

    @property
    def how(self) -> str:
        return "one model per coalition"

    def totals(self, coeffs: Tensor) -> Tensor:
        x, y, names = self.inputs.x_val, self.inputs.y_val, self.inputs.names
        cells, metric, width = self.inputs.cells(), self.inputs.metric, self.inputs.width
        totals = torch.zeros((coeffs.shape[0], width), dtype=torch.float64, device=self.compute.device)
        for b in range(coeffs.shape[0]):
            state = {name: coalition_state(self.inputs, name, coeffs[b : b + 1])[0] for name in names}
            rebuilt = copy.deepcopy(self.compute.model)
            rebuilt.load_state_dict(state, strict=False)
            rebuilt.eval()
            for start in range(0, x.shape[0], NAIVE_CHUNK):
                part = slice(start, start + NAIVE_CHUNK)
                with self.compute.autocast():
                    logits = rebuilt(x[part])
                totals[b] += score_logits(logits[None], y[part], metric, cells[part], width)[0]
        return totals
