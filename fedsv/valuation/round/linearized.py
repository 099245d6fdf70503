"""A round's model linearized around w_t: a cheap surrogate game for a control variate (surrogate.py).

Coalition S's model is w_t + sum_i c_i(S) delta_i (the aggregation's coefficients, round_inputs.
coalition_weights). To first order its logits on a validation sample x are f(w_t)(x) + sum_i c_i(S)
J_i(x), J_i(x) the Jacobian-vector product of the model along delta_i: m JVPs over the validation set
once per round (about 3m forward passes), then a coalition costs an (m x classes) combination per
sample instead of a forward pass. The surrogate is scored with the round's own metric and split into
the round's validation cells, so that a residual U - G splits by label and fold as U does.

How closely it follows the round depends on the model: the issue's probe found the paper's MLP's
accuracies correlated 0.93 with it (15% of their variance left), the MNIST CNN's only 0.3-0.5.
surrogate.SurrogateCorrected stays unbiased either way; ResidualGame.explained() measures the gain.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

from fedsv.valuation.games.class_scores import ClassScores
from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game, bitmasks
from fedsv.valuation.round.executors.compute import Compute
from fedsv.valuation.round.round_inputs import RoundInputs, coalition_weights, score_logits

CHUNK_SAMPLES = 256
"""Validation samples per JVP call."""

LOGIT_FLOATS = 2**22
"""Most logits (coalitions x samples x classes) combined at once."""


class LinearizedRound(Game):
    """The first-order surrogate of a round game (RoundGame.surrogate()): its inputs, its model and how
    it computes, and its validation folds' shares. The rule must combine deltas linearly (FedAvg,
    uniform, Krum, Multi-Krum), not coordinate-wise (median, trimmed mean)."""

    def __init__(self, inputs: RoundInputs, model: nn.Module, compute: Compute, shares: FloatArray) -> None:
        if inputs.rule.coordinatewise:
            raise ValueError(
                f"the {inputs.rule.name} rule does not combine deltas linearly: no linearized surrogate"
            )
        super().__init__(inputs.m)
        self.inputs = inputs
        self.base, self.tangents = _linearize(inputs, model, compute)
        self.class_scores = ClassScores(inputs.m, inputs.classes, shares)
        self.computes_on_cpu = inputs.device.type == "cpu"
        self.resolution = 1.0 / inputs.num_samples if inputs.metric == "accuracy" else None

    def cell_scores(self) -> ClassScores:
        return self.class_scores

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        inputs, n = self.inputs, self.inputs.num_samples
        coeffs = coalition_weights(members, inputs)
        batch = max(1, LOGIT_FLOATS // max(1, self.tangents[0].numel()))
        totals = torch.cat(
            [
                score_logits(
                    self.base + torch.einsum("bm,mnc->bnc", coeffs[b0 : b0 + batch], self.tangents),
                    inputs.y_val,
                    inputs.metric,
                    inputs.cells(),
                    inputs.width,
                )
                for b0 in range(0, coeffs.shape[0], batch)
            ]
        )
        by_cell = (totals / n).cpu().numpy()
        self.class_scores.add(bitmasks(members), by_cell)
        return np.asarray(by_cell.sum(axis=1), dtype=np.float64)


def _linearize(inputs: RoundInputs, model: nn.Module, compute: Compute) -> tuple[Tensor, Tensor]:
    """w_t's logits on the validation set (n, classes) and each delta's JVP (m, n, classes).

    The JVP runs along the deltas of the parameters only: the floating-point buffers a coalition also
    averages (BatchNorm's running statistics) stay at w_t's, as constants (torch's batch_norm has no
    forward derivative in them). What they change is left to the residual, which the sampler samples.
    """
    parameters = {name for name, _ in model.named_parameters()}
    moving = [name for name in inputs.names if name in parameters]
    fixed = {name: inputs.global_params[name] for name in inputs.names if name not in parameters}
    primals = tuple(inputs.global_params[name] for name in moving)

    def forward(x: Tensor, *state: Tensor) -> Tensor:
        return functional_call(model, {**fixed, **dict(zip(moving, state, strict=True))}, (x,))

    bases, per_delta = [], []
    with compute.computing(), torch.no_grad():
        for start in range(0, inputs.num_samples, CHUNK_SAMPLES):
            x = inputs.x_val[start : start + CHUNK_SAMPLES]
            bases.append(forward(x, *primals))
            rows = []
            for i in range(inputs.m):
                tangent = tuple(
                    inputs.delta_matrix(name)[i].reshape(primal.shape)
                    for name, primal in zip(moving, primals, strict=True)
                )
                rows.append(jvp(lambda *state, x=x: forward(x, *state), primals, tangent)[1])
            per_delta.append(torch.stack(rows))
    return torch.cat(bases), torch.cat(per_delta, dim=1)


__all__ = ["LinearizedRound"]
