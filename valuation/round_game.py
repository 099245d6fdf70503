"""RoundGame: U(S) = metric(w_t + aggregate of S's deltas), many coalitions per forward pass."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedsv.valuation import stacked_head
from fedsv.valuation.game import BoolMatrix, FloatArray, Game
from fedsv.valuation.round_inputs import RoundInputs, coalition_weights, score_logits

logger = logging.getLogger(__name__)

MODES = ("fast", "batched", "naive")


def _has_linear_stem(model: nn.Module) -> bool:
    """True if the model exposes prepare/stem/head with a stem that is linear in its parameters."""
    stem = getattr(model, "stem", None)
    if isinstance(stem, nn.Conv2d) and stem.groups != 1:
        return False  # _stem_outputs stacks the deltas along the output channels: groups=1 only
    return (
        isinstance(stem, (nn.Linear, nn.Conv2d))
        and isinstance(getattr(model, "head", None), nn.Module)
        and callable(getattr(model, "prepare", None))
    )


class RoundGame(Game):
    """The federated-SV game of one round, evaluated on a validation set.

    U(S) = metric(w_t + server_lr * aggregate_{i in S}(delta_i)), U(empty) = metric(w_t), with the
    coordinator's aggregation rule ("fedavg": weighted by sample counts over S; "uniform").

    Modes (all give the same utilities up to float rounding; tests compare them):
      - "fast": the first layer is linear in its weights, so the validation set's stem outputs are
        computed once for w_t and once for each delta; a coalition's stem output is their
        weighted sum. The rest of the network runs for a batch of coalitions at once (stacked
        parameters, vmap -> batched matmul / grouped conv). Needs a model with prepare/stem/head.
      - "batched": stacked parameters and vmap over the whole model (any nn.Module).
      - "naive": one model rebuilt per coalition (the straightforward reference).
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
        metric: str = "accuracy",
        aggregation: str = "fedavg",
        server_lr: float = 1.0,
        mode: str = "fast",
        memory_budget_mb: float = 256.0,
        working_set_floats: int = 2**20,
    ) -> None:
        self.inputs = RoundInputs.build(
            model, global_params, deltas, sample_counts, x_val, y_val, metric, aggregation, server_lr
        )
        super().__init__(len(self.inputs.deltas))
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
        if mode == "fast" and not _has_linear_stem(model):
            logger.info("model has no linear stem/head split; using mode='batched'")
            mode = "batched"
        if memory_budget_mb <= 0:
            raise ValueError(f"memory_budget_mb must be positive, got {memory_budget_mb}")
        self.mode = mode
        self.model = model
        self._budget_floats = int(memory_budget_mb * 2**20 / 4)
        self._working_set = max(1, int(working_set_floats))
        self._stem_cache: list[tuple[int, Tensor, Tensor]] | None = None

    # ---------------------------------------------------------------- dispatch
    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        coeffs = coalition_weights(members, self.inputs)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self.mode == "fast":
                    scores = self._evaluate_fast(coeffs)
                elif self.mode == "batched":
                    scores = self._evaluate_batched(coeffs)
                else:
                    scores = self._evaluate_naive(coeffs)
        finally:
            self.model.train(was_training)
        return scores / float(self.inputs.num_samples)

    # ---------------------------------------------------------------- helpers
    def _stacked(self, names: Sequence[str], coeffs: Tensor, prefix: str = "") -> dict[str, Tensor]:
        """Parameters of each coalition in the batch: p0 + coeffs @ deltas, shape (B, *p0.shape)."""
        return {name[len(prefix) :]: self._stacked_one(name, coeffs) for name in names}

    def _stacked_one(self, name: str, coeffs: Tensor) -> Tensor:
        base = self.inputs.global_params[name]
        flat = torch.addmm(base.reshape(1, -1), coeffs, self.inputs.delta_matrix(name))
        return flat.reshape(-1, *base.shape)

    # ---------------------------------------------------------------- fast: linear stem
    def _stem_outputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Stem outputs of a validation chunk for w_t, shape (n, *F), and per delta, (m, n, *F)."""
        stem, prepared = self._stem(), self.model.prepare(x)  # type: ignore[operator]
        names = [k for k, _ in stem.named_parameters()]
        base = functional_call(stem, {k: self.inputs.global_params[f"stem.{k}"] for k in names}, (prepared,))
        # All deltas in one call: stack them along the layer's output dimension.
        stacked = {k: torch.cat([d[f"stem.{k}"] for d in self.inputs.deltas], dim=0) for k in names}
        out = functional_call(stem, stacked, (prepared,))  # (n, m*out, ...)
        out = out.reshape(out.shape[0], self.m, -1, *out.shape[2:]).transpose(0, 1).contiguous()
        return base, out

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

    def _stem(self) -> nn.Module:
        stem = self.model.stem
        assert isinstance(stem, nn.Module)
        return stem

    def _stem_floats(self) -> int:
        """Numbers in one sample's stem output."""
        with torch.no_grad():
            return int(self._stem()(self.model.prepare(self.inputs.x_val[:1])).numel())  # type: ignore[operator]

    def _evaluate_fast(self, coeffs: Tensor) -> FloatArray:
        head = self.model.head
        assert isinstance(head, nn.Module)
        head_names = [n for n in self.inputs.names if n.startswith("head.")]
        use_stacked = isinstance(head, nn.Sequential) and stacked_head.supports(head)
        totals = np.zeros(coeffs.shape[0], dtype=np.float64)
        y = self.inputs.y_val
        features = self._stem_floats()
        if any(isinstance(layer, nn.Conv2d) for layer in head.modules()):
            # Convolutions run one coalition at a time (see stacked_head): big sample chunks, few coalitions.
            chunk = max(1, min(self.inputs.num_samples, self._budget_floats // (8 * features * (self.m + 1))))
            batch = 4
        else:
            # Matmul heads: keep a batch's activations cache-sized.
            chunk = max(1, min(self.inputs.num_samples, self._working_set // (16 * features)))
            batch = max(1, min(256, self._working_set // (chunk * features)))

        def run_head(params: dict[str, Tensor], h: Tensor) -> Tensor:
            return functional_call(head, params, (h,))

        for start, base, per_delta in self._stem_chunks(chunk):
            n_c = base.shape[0]
            flat_delta = per_delta.reshape(self.m, -1)
            for b0 in range(0, coeffs.shape[0], batch):
                c = coeffs[b0 : b0 + batch]
                h = torch.addmm(base.reshape(1, -1), c, flat_delta).reshape(c.shape[0], *base.shape)
                if use_stacked:
                    logits = stacked_head.run_stacked(
                        head,  # type: ignore[arg-type]
                        lambda name, c=c: self._stacked_one(f"head.{name}", c),  # type: ignore[misc]
                        h,
                    )
                else:
                    logits = vmap(run_head)(self._stacked(head_names, c, prefix="head."), h)
                totals[b0 : b0 + batch] += score_logits(logits, y[start : start + n_c], self.inputs.metric)
        return totals

    # ---------------------------------------------------------------- batched: vmap whole model
    def _evaluate_batched(self, coeffs: Tensor) -> FloatArray:
        model = self.model
        x, y = self.inputs.x_val, self.inputs.y_val
        totals = np.zeros(coeffs.shape[0], dtype=np.float64)
        buffers = dict(model.named_buffers())
        probe = model(x[:1]).numel()
        batch = max(1, self._budget_floats // max(1, 3 * x.shape[0] * max(probe, int(x[:1].numel()))))

        def run(params: dict[str, Tensor], inputs: Tensor) -> Tensor:
            return functional_call(model, {**params, **buffers}, (inputs,))

        for b0 in range(0, coeffs.shape[0], batch):
            c = coeffs[b0 : b0 + batch]
            params = self._stacked(self.inputs.names, c)
            logits = vmap(run, in_dims=(0, None))(params, x)
            totals[b0 : b0 + batch] += score_logits(logits, y, self.inputs.metric)
        return totals

    # ---------------------------------------------------------------- naive: one model per coalition
    def _evaluate_naive(self, coeffs: Tensor) -> FloatArray:
        x, y = self.inputs.x_val, self.inputs.y_val
        totals = np.zeros(coeffs.shape[0], dtype=np.float64)
        for b in range(coeffs.shape[0]):
            params = self._stacked(self.inputs.names, coeffs[b : b + 1])
            rebuilt = copy.deepcopy(self.model)
            rebuilt.load_state_dict({name: value[0] for name, value in params.items()}, strict=False)
            rebuilt.eval()
            totals[b] = score_logits(rebuilt(x)[None], y, self.inputs.metric)[0]
        return totals
