"""RoundGame: U(S) = metric(w_t + aggregate of S's deltas), many coalitions per forward pass."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedsv.fl.aggregation import AggregationRule
from fedsv.fl.device import resolve_device
from fedsv.valuation import fused_head, stacked_head
from fedsv.valuation.device import DEFAULT_WORKING_SET, PRECISIONS, default_budget_mb, lives_on, tf32_allowed
from fedsv.valuation.game import BoolMatrix, FloatArray, Game
from fedsv.valuation.round_inputs import Metric, RoundInputs, coalition_weights, score_logits
from fedsv.valuation.stem_split import StemSplit, split_stem

logger = logging.getLogger(__name__)

MODES = ("fast", "batched", "naive")

MAX_CUDA_BATCH = 4096
"""Most coalitions per head batch on CUDA (fewer launches; the working set bounds it first)."""


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

    Modes (all give the same utilities up to float rounding; tests compare them):
      - "fast": the model is an nn.Sequential (nested ones flattened) whose first layer with
        parameters (the stem) is an nn.Linear or an nn.Conv2d with groups == 1, preceded only by
        nn.Flatten / nn.Unflatten / nn.Identity (see stem_split). The stem is linear in its
        parameters, so its outputs on the validation set are computed once for w_t and once for each
        delta, and a coalition's stem output is their weighted sum. The layers after it (the head;
        buffers allowed) run for a batch of coalitions at once: stacked parameters with batched
        matmul (stacked_head) where every head layer is supported, torch.func.vmap otherwise.
      - "batched": stacked parameters and vmap over the whole model (any nn.Module).
      - "naive": one model rebuilt per coalition (the straightforward reference).
    The requested mode is a ceiling: "fast" falls back to "batched" for a model without a stem split
    (or whose head fails under vmap), and "batched" to "naive" when vmap fails on the model; the
    choice and its reason are logged at INFO.

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
    (fused_head); False keeps the layer-by-layer head everywhere.

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
        self._budget_floats = int(budget_mb * 2**20 / 4)
        if working_set_floats is None:
            cuda = self.device.type == "cuda"
            working_set_floats = (
                max(DEFAULT_WORKING_SET, self._budget_floats // 8) if cuda else DEFAULT_WORKING_SET
            )
        self._working_set = max(1, int(working_set_floats))
        self._stem_cache: list[tuple[int, Tensor, Tensor]] | None = None
        self._stem_features: int | None = None
        self._split: StemSplit | None = None
        self._use_stacked = False
        self._allow_fused = fused
        self._fused: fused_head.FusedMLPHead | None = None
        self.mode, reason = self._choose_mode(mode)
        logger.info("RoundGame mode %r on %s (%s): %s", self.mode, self.device, self.precision, reason)

    # ---------------------------------------------------------------- execution context
    @contextmanager
    def _computing(self) -> Iterator[None]:
        """Eval mode, no autograd, no caller's autocast, and on CUDA the precision's TF32 setting."""
        was_training = self.model.training
        self.model.eval()
        tf32 = tf32_allowed(self.precision == "tf32") if self.device.type == "cuda" else nullcontext()
        try:
            with torch.no_grad(), torch.autocast(self.device.type, enabled=False), tf32:
                yield
        finally:
            self.model.train(was_training)

    def _autocast(self) -> AbstractContextManager[object]:
        """Around forward passes: bfloat16 autocast under precision "bf16", nothing otherwise."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _exact(self) -> AbstractContextManager[object]:
        """Inside a forward pass: parameters combined in the inputs' dtype, whatever the precision."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, enabled=False)
        return nullcontext()

    # ---------------------------------------------------------------- mode choice

    def _fails(self, probe: Callable[[], object]) -> str | None:
        """None if the probe runs, otherwise why not (its exception, shortened)."""
        try:
            with self._computing():
                probe()
        except Exception as exc:  # any failure of vmap on this model means: do not use it
            message = " ".join(str(exc).split())
            return f"{type(exc).__name__}: {message[:200]}"
        return None

    def _choose_mode(self, requested: str) -> tuple[str, str]:
        """The mode this game runs in and why."""
        probe_coeffs = torch.zeros((2, self.m), dtype=self.inputs.weights.dtype, device=self.device)
        probe_coeffs[1] = coalition_weights(np.ones((1, self.m), dtype=bool), self.inputs)[0]
        x_probe = self.inputs.x_val[:2]
        why = ""
        if requested == "fast" and self.inputs.rule.coordinatewise:
            why, requested = (
                f"no fast path: {self.inputs.rule.name} is not a weighted sum of deltas; ",
                "batched",
            )
        if requested == "fast":
            split, found = split_stem(self.model, self.inputs.names)
            if split is not None and isinstance(split.stem, nn.Conv2d):
                with self._computing():
                    dims = split.prepare(x_probe).dim()
                if dims != 4:
                    split, found = None, f"{found}, but its Conv2d input has {dims} dimensions, not 4"
            if split is not None:
                self._split = split
                if stacked_head.supports(split.head):
                    self._use_stacked = True
                    if self._allow_fused:
                        metric = self.inputs.metric
                        self._fused = fused_head.plan(split.head, self.device, self.precision, metric)
                    if self._fused is not None:
                        return "fast", f"{found}; head by the fused kernel (fused_head)"
                    return "fast", f"{found}; head by stacked matmul"
                failure = self._fails(lambda: self._head_logits(probe_coeffs, *self._stem_outputs(x_probe)))
                if failure is None:
                    return "fast", f"{found}; head by vmap (a layer the stacked executor does not implement)"
                self._split = None
                found = f"{found}, but its head fails under vmap ({failure})"
            why = f"no fast path: {found}; "
            requested = "batched"
        if requested == "batched":
            failure = self._fails(lambda: self._batched_logits(probe_coeffs, x_probe))
            if failure is None:
                return "batched", f"{why}vmap over the whole model"
            return "naive", f"{why}vmap over the model fails ({failure}); one model per coalition"
        return "naive", "one model per coalition, as requested"

    # ---------------------------------------------------------------- dispatch
    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        coeffs = coalition_weights(members, self.inputs)
        with self._computing():
            if self.mode == "fast":
                totals = self._evaluate_fast(coeffs)
            elif self.mode == "batched":
                totals = self._evaluate_batched(coeffs)
            else:
                totals = self._evaluate_naive(coeffs)
        # The one copy to the host of this batch of coalitions.
        utilities: FloatArray = (totals / float(self.inputs.num_samples)).cpu().numpy()
        return utilities

    # ---------------------------------------------------------------- helpers
    def _stacked(self, names: Iterable[str], coeffs: Tensor) -> dict[str, Tensor]:
        """State of each coalition in the batch: p0 + coeffs @ deltas, shape (B, *p0.shape)."""
        return {name: self._stacked_one(name, coeffs) for name in names}

    def _stacked_one(self, name: str, coeffs: Tensor) -> Tensor:
        base = self.inputs.global_params[name]
        matrix = self.inputs.delta_matrix(name)
        if self.inputs.rule.coordinatewise:  # coeffs are the membership (coalition_weights)
            combined = self.inputs.rule.combine(coeffs > 0, matrix) * self.inputs.server_lr
            return (base.reshape(1, -1) + combined).reshape(-1, *base.shape)
        flat = torch.addmm(base.reshape(1, -1), coeffs, matrix)
        return flat.reshape(-1, *base.shape)

    # ---------------------------------------------------------------- fast: linear stem
    def _split_or_fail(self) -> StemSplit:
        assert self._split is not None, "mode 'fast' without a stem split"
        return self._split

    def _stem_outputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Stem outputs of a validation chunk for w_t, shape (n, *F), and per delta, (m, n, *F)."""
        split = self._split_or_fail()
        prepared = split.prepare(x)
        glob = self.inputs.global_params
        # All deltas in one call: stack them along the layer's output features (rows of weight and bias).
        stacked = {
            k: self.inputs.delta_matrix(full).reshape(-1, *glob[full].shape[1:])
            for k, full in split.stem_names.items()
        }
        with self._autocast():
            base = functional_call(
                split.stem, {k: glob[full] for k, full in split.stem_names.items()}, (prepared,)
            )
            out = functional_call(split.stem, stacked, (prepared,))  # (n, m*out, ...) or (n, ..., m*out)
        # Kept and combined per coalition in the inputs' dtype (no-ops unless autocast made them bf16).
        base, out = base.to(x.dtype), out.to(x.dtype)
        dim = split.stem_output_dim()
        out = out.unflatten(dim, (self.m, -1)).movedim(dim if dim >= 0 else dim - 1, 0)
        return base, out.contiguous()

    def _stem_chunks(self, chunk: int) -> Iterable[tuple[int, Tensor, Tensor]]:
        """(start, w_t stem output, per-delta stem outputs) per validation chunk.

        Computed once per round and kept when they fit the memory budget; otherwise produced lazily,
        one chunk at a time, on every call (so only one chunk's stem outputs are alive at once).
        """
        if self._stem_cache is not None:
            return self._stem_cache
        x = self.inputs.x_val
        starts = range(0, x.shape[0], chunk)
        if self._stem_floats() * x.shape[0] * (self.m + 1) <= self._budget_floats:
            self._stem_cache = [(s, *self._stem_outputs(x[s : s + chunk])) for s in starts]
            return self._stem_cache
        return ((s, *self._stem_outputs(x[s : s + chunk])) for s in starts)

    def _stem_floats(self) -> int:
        """Numbers in one sample's stem output."""
        if self._stem_features is None:
            split = self._split_or_fail()
            self._stem_features = int(split.stem(split.prepare(self.inputs.x_val[:1])).numel())
        return self._stem_features

    def _head_logits(self, c: Tensor, base: Tensor, per_delta: Tensor) -> Tensor:
        """Logits (B, n, classes) of B coalitions with coefficients c from a chunk's stem outputs."""
        split = self._split_or_fail()
        names = split.head_names
        if self._use_stacked:

            def param(name: str) -> Tensor:
                with self._exact():
                    return self._stacked_one(names[name], c)

            first = 0
            if len(split.head) and isinstance(split.head[0], nn.ReLU):  # fused into the stem sum (cuBLASLt)
                h = torch._addmm_activation(base.reshape(-1), c, per_delta.reshape(self.m, -1))
                first = 1
            else:
                h = torch.addmm(base.reshape(1, -1), c, per_delta.reshape(self.m, -1))
            with self._autocast():
                return stacked_head.run_stacked(split.head, param, h.reshape(c.shape[0], *base.shape), first)

        h = torch.addmm(base.reshape(1, -1), c, per_delta.reshape(self.m, -1)).reshape(
            c.shape[0], *base.shape
        )

        def run_head(state: dict[str, Tensor], inputs: Tensor) -> Tensor:
            return functional_call(split.head, state, (inputs,))

        state = {rel: self._stacked_one(full, c) for rel, full in names.items()}
        with self._autocast():
            return vmap(run_head)(state, h)

    def _fast_chunking(self) -> tuple[int, int]:
        """(validation samples per stem chunk, coalitions per head batch) of mode "fast"."""
        head = self._split_or_fail().head
        features = self._stem_floats()
        cuda = self.device.type == "cuda"
        if any(isinstance(layer, nn.Conv2d) for layer in head.modules()):
            chunk = max(1, min(self.inputs.num_samples, self._budget_floats // (8 * features * (self.m + 1))))
            if not cuda:  # one convolution per coalition (stacked_head): big sample chunks, few coalitions
                return chunk, 4
            # One grouped convolution per batch: as many coalitions as a working set of activations holds.
            return chunk, max(4, min(MAX_CUDA_BATCH, self._working_set // (4 * chunk * features)))
        # Matmul heads: keep a batch's activations cache-sized (on CUDA: a working set of device memory).
        chunk = max(1, min(self.inputs.num_samples, self._working_set // (16 * features)))
        cap = MAX_CUDA_BATCH if cuda else 256
        return chunk, max(1, min(cap, self._working_set // (chunk * features)))

    def prepare(self) -> None:
        """Compute the round's stem outputs now (mode "fast", when they fit the memory budget)."""
        if self.mode == "fast" and self._stem_cache is None:
            with self._computing():
                for _ in self._stem_chunks(self._fast_chunking()[0]):
                    pass

    def _evaluate_fast(self, coeffs: Tensor) -> Tensor:
        totals = torch.zeros(coeffs.shape[0], dtype=torch.float64, device=self.device)
        y = self.inputs.y_val
        chunk, batch = self._fast_chunking()
        for start, base, per_delta in self._stem_chunks(chunk):
            n_c = base.shape[0]
            for b0 in range(0, coeffs.shape[0], batch):
                c = coeffs[b0 : b0 + batch]
                if self._fused is not None:
                    totals[b0 : b0 + batch] += self._fused_correct(c, base, per_delta, y[start : start + n_c])
                    continue
                logits = self._head_logits(c, base, per_delta)
                totals[b0 : b0 + batch] += score_logits(logits, y[start : start + n_c], self.inputs.metric)
        return totals

    def _fused_correct(self, c: Tensor, base: Tensor, per_delta: Tensor, y: Tensor) -> Tensor:
        """Correct predictions (B,) of a chunk by the fused head kernel, from the ReLU'd stem sums."""
        fused = self._fused
        assert fused is not None
        names = self._split_or_fail().head_names
        h1 = torch._addmm_activation(base.reshape(-1), c, per_delta.reshape(self.m, -1))
        params = {
            rel: self._stacked_one(names[rel], c)
            for rel in (fused.hidden_weight, fused.hidden_bias, fused.out_weight, fused.out_bias)
        }
        counts = fused_head.correct_counts(fused, h1.view(c.shape[0], *base.shape), params, y, self.precision)
        return counts.to(torch.float64)

    # ---------------------------------------------------------------- batched: vmap whole model
    def _batched_logits(self, c: Tensor, x: Tensor) -> Tensor:
        """Logits (B, n, classes): the whole model under vmap, parameters and float buffers stacked."""
        model = self.model

        def run(state: dict[str, Tensor], inputs: Tensor) -> Tensor:
            return functional_call(model, state, (inputs,))  # integer buffers: the model's own

        state = self._stacked(self.inputs.names, c)
        with self._autocast():
            return vmap(run, in_dims=(0, None))(state, x)

    def _evaluate_batched(self, coeffs: Tensor) -> Tensor:
        x, y = self.inputs.x_val, self.inputs.y_val
        totals = torch.zeros(coeffs.shape[0], dtype=torch.float64, device=self.device)
        probe = self.model(x[:1]).numel()
        batch = max(1, self._budget_floats // max(1, 3 * x.shape[0] * max(probe, int(x[:1].numel()))))
        for b0 in range(0, coeffs.shape[0], batch):
            c = coeffs[b0 : b0 + batch]
            totals[b0 : b0 + batch] += score_logits(self._batched_logits(c, x), y, self.inputs.metric)
        return totals

    # ---------------------------------------------------------------- naive: one model per coalition
    def _evaluate_naive(self, coeffs: Tensor) -> Tensor:
        x, y = self.inputs.x_val, self.inputs.y_val
        totals = torch.zeros(coeffs.shape[0], dtype=torch.float64, device=self.device)
        for b in range(coeffs.shape[0]):
            state = self._stacked(self.inputs.names, coeffs[b : b + 1])
            rebuilt = copy.deepcopy(self.model)
            rebuilt.load_state_dict({name: value[0] for name, value in state.items()}, strict=False)
            rebuilt.eval()
            with self._autocast():
                logits = rebuilt(x)
            totals[b : b + 1] = score_logits(logits[None], y, self.inputs.metric)
        return totals
