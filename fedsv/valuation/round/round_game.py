"""RoundGame: U(S) = metric(w_t + aggregate of S's deltas), many coalitions per forward pass."""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.fl.aggregation import AggregationRule
from fedsv.fl.device import resolve_device
from fedsv.valuation.games.class_scores import ClassScores, fold_count, fold_split
from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game, bitmasks
from fedsv.valuation.round.device import PRECISIONS, default_budget_mb, lives_on
from fedsv.valuation.round.executors import MODES, Compute, Executor, Memory, plan_executor
from fedsv.valuation.round.linearized import LinearizedRound
from fedsv.valuation.round.round_inputs import Metric, RoundInputs, coalition_weights

logger = logging.getLogger(__name__)

__all__ = ["MODES", "RoundGame"]

_TOLD: weakref.WeakKeyDictionary[nn.Module, set[str]] = weakref.WeakKeyDictionary()
"""The executor choices already logged at INFO per model (a run builds one game per round)."""


def _tell(model: nn.Module, message: str) -> None:
    """Log the game's executor choice at INFO the first time for this model, at DEBUG after."""
    told = _TOLD.setdefault(model, set())
    logger.log(logging.DEBUG if message in told else logging.INFO, "%s", message)
    told.add(message)


class RoundGame(Game):
    """The federated-SV game of one round, evaluated on a validation set.

    U(S) = metric(w_t + server_lr * aggregate_{i in S}(delta_i)), U(empty) = metric(w_t), with the
    coordinator's aggregation rule (an AggregationRule or its name: "fedavg", weighted by sample counts
    over S; "uniform"; "krum" and "multi_krum", which select within S and keep the fast path;
    "median" and "trimmed_mean", coordinate-wise, which take the batched path). The metric
    is "accuracy", "neg_loss" (mean log-likelihood of the labels) or a callable (logits (n, classes),
    y (n,)) -> per-sample scores (n,), U = their mean.

    What a coalition's model is: the model's federated state is its named parameters plus its
    floating-point buffers (by state_dict name, e.g. BatchNorm's running_mean and running_var);
    `global_params` and every delta must hold exactly those tensors. Coalition S's model has parameters
    AND float buffers w_t + server_lr * aggregate_S(deltas) and is evaluated in eval mode, so BatchNorm
    normalizes with the aggregated running statistics. Integer buffers (num_batches_tracked) are
    local: every mode uses the model's own.

    Modes (all give the same utilities up to float rounding; tests compare them), each an executor
    (fedsv.valuation.round.executors) that plan_executor picks:
      - "fast": the model's first layer with parameters (the stem) is an nn.Linear or an nn.Conv2d
        with groups == 1 that sees the input only through parameter-free steps, and the rest of the
        model sees the input only through the stem's output. An nn.Sequential (nested ones
        flattened) is split layer by layer (executors.stem_split); any other nn.Module is traced
        with torch.fx and cut at the stem (executors.traced_split; a traced head that is a plain
        chain of layers is rebuilt as an nn.Sequential). The stem is linear in its parameters, so
        its outputs on the validation set are computed once for w_t and once for each delta, and a
        coalition's stem output is their weighted sum. The layers after it (the head; buffers
        allowed) run for a batch of coalitions at once: stacked parameters with batched matmul
        (executors.stacked_head) where every head layer is supported, torch.func.vmap otherwise.
      - "batched": stacked parameters and vmap over the whole model (any nn.Module).
      - "naive": one model rebuilt per coalition (the straightforward reference).
    The requested mode is a ceiling: "fast" falls back to "batched" for a model without a stem split
    (or whose head fails under vmap), and "batched" to "naive" when vmap fails on the model; the
    choice and its reason are logged at INFO, once per model (later rounds' games log it at DEBUG).

    Device: the game computes on `device` ("auto": CUDA when available, else the CPU; "cpu", "cuda",
    "cuda:N"; anything else, or a CUDA device this machine lacks, raises ValueError). w_t, the deltas,
    the weights and the validation data move there once, when the game is built; coalition batches are
    built there and scores accumulate there, copied to the host once per batch of coalitions evaluated.
    The caller's model is never moved: a model not already on the device is copied there
    (copy.deepcopy(model).to(device)); one already there is used in place (its train/eval flag is
    switched to eval during an evaluation and restored). `memory_budget_mb` left unset is 256 MiB on the
    CPU and CUDA_BUDGET_FRACTION of the free memory of a CUDA device; `working_set_floats` left unset
    is 2**20 on the CPU and an eighth of the budget on CUDA.

    `fused` (default True) lets a CUDA game in "tf32" scored by accuracy run a ReLU-Linear-ReLU-Linear
    head (the paper's MLP) as one Triton kernel that keeps the hidden activations on chip
    (executors.fused_head); False keeps the layer-by-layer head everywhere.

    Precision: "fp32" (default) computes in the inputs' dtype; on CUDA TF32 is switched off for the
    game's matmuls and convolutions, so CPU and CUDA differ by float rounding only. "tf32" lets CUDA
    use TF32 for float32 matmuls and convolutions (on the CPU it is "fp32"). "bf16" runs the forward
    passes under torch.autocast with bfloat16 (CPU and CUDA; the coalitions' parameters are combined
    in the inputs' dtype, then cast by autocast; logits are scored in float32/float64). Both apply to
    float32 models (a float64 game is unaffected). Under "tf32" and "bf16" the utilities can change:
    an accuracy counts a validation sample differently when it lies near a decision boundary, and the
    modes no longer agree exactly. The TF32 flags are process-wide while the game evaluates.
    """

    def __init__(
        self,
        model: nn.Module,
        global_params: Mapping[str, Tensor],
        deltas: Sequence[Mapping[str, Tensor]],
        sample_counts: Sequence[float],
        x_val: Tensor | np.ndarray,
        y_val: Tensor | np.ndarray,
        *,
        metric: Metric = "accuracy",
        aggregation: str | AggregationRule = "fedavg",
        server_lr: float = 1.0,
        mode: str = "fast",
        memory_budget_mb: float | None = None,
        working_set_floats: int | None = None,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
        fused: bool = True,
    ) -> None:
        self.device = resolve_device(device)
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}")
        self.precision = precision
        self.inputs = RoundInputs.build(
            model,
            global_params,
            deltas,
            sample_counts,
            x_val,
            y_val,
            metric,
            aggregation,
            server_lr,
            self.device,
        )
        super().__init__(self.inputs.m)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
        if memory_budget_mb is not None and not memory_budget_mb > 0:
            raise ValueError(f"memory_budget_mb must be positive, got {memory_budget_mb}")
        self.model = model if lives_on(model, self.device) else copy.deepcopy(model).to(self.device)
        if self.model is not model:
            self.model.eval()  # the game's own copy stays in eval mode
        budget_mb = default_budget_mb(self.device) if memory_budget_mb is None else float(memory_budget_mb)
        self.memory = Memory.of(self.device, budget_mb, working_set_floats)
        self.compute = Compute(self.model, self.device, precision)
        with self.compute.computing():
            self.inputs.classes = int(self.model(self.inputs.x_val[:1]).shape[-1])
        if int(self.inputs.y_val.max()) >= self.inputs.classes or int(self.inputs.y_val.min()) < 0:
            raise ValueError(
                f"validation labels must lie in 0..{self.inputs.classes - 1}, the model's outputs"
            )
        folds = fold_count(self.m, self.inputs.classes, self.inputs.num_samples)
        fold, shares = fold_split(self.inputs.num_samples, folds)
        self.inputs.folds = folds
        self.inputs.bins = self.inputs.y_val * folds + torch.from_numpy(fold).to(self.inputs.device)
        self.class_scores = ClassScores(self.m, self.inputs.classes, shares)
        self.executor: Executor
        self.executor, reason = plan_executor(mode, self.inputs, self.compute, self.memory, fused)
        self.mode = self.executor.mode
        self.computed_by = f"mode {self.mode!r} on {self.device} ({self.precision}): {reason}"
        self.computes_on_cpu = self.device.type == "cpu"
        self.resolution = 1.0 / self.inputs.num_samples if metric == "accuracy" else None
        self._surrogate: LinearizedRound | None = None
        self._no_surrogate = False  # the model could not be linearized: no forward-mode derivative
        _tell(model, f"RoundGame {self.computed_by}")

    def prepare(self) -> None:
        """Do the round's one-off work now (mode "fast": the stem outputs, when they fit the budget)."""
        self.executor.prepare()

    def surrogate(self) -> Game | None:
        """The round's model linearized around w_t (linearized.LinearizedRound), built once; None for a
        coordinate-wise rule (median, trimmed mean), which does not combine the deltas linearly."""
        if self.inputs.rule.coordinatewise or self._no_surrogate:
            return None
        if self._surrogate is None:
            try:
                self._surrogate = LinearizedRound(
                    self.inputs, self.model, self.compute, self.class_scores.shares
                )
            except (RuntimeError, NotImplementedError) as exc:  # an operation without forward-mode AD
                self._no_surrogate = True
                why = (str(exc).splitlines() or [type(exc).__name__])[0]
                _tell(self.model, f"RoundGame: no linearized surrogate for this model ({why})")
                return None
        return self._surrogate

    def cell_scores(self) -> ClassScores:
        """What this game evaluated, split by validation label and fold (class_scores.ClassScores)."""
        return self.class_scores

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        coeffs = coalition_weights(members, self.inputs)
        with self.compute.computing():
            totals = self.executor.totals(coeffs)
        # The one copy to the host of this batch of coalitions.
        n = float(self.inputs.num_samples)
        by_cell, utilities = (totals / n).cpu().numpy(), (totals.sum(dim=1) / n).cpu().numpy()
        self.class_scores.add(bitmasks(members), by_cell)
        return np.asarray(utilities, dtype=np.float64)
