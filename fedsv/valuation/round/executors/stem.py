"""A linear stem's outputs on the validation set, for w_t and per delta: computed once, kept if they fit."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor
from torch.func import functional_call

from fedsv.valuation.round.executors.compute import Compute, Memory
from fedsv.valuation.round.executors.stem_split import StemSplit
from fedsv.valuation.round.round_inputs import RoundInputs

Chunk = tuple[int, Tensor, Tensor]
"""(first validation sample, w_t's stem outputs (n, *F), the m deltas' stem outputs (m, n, *F))."""


class StemOutputs:
    """The stem is linear in its parameters: on the validation set its output for w_t + sum c_i delta_i is
    H_0 + sum c_i H_i. H_0 and the H_i are computed once per round (one call with the deltas stacked
    along the layer's output features) and kept when they fit the memory budget; otherwise they are
    produced again chunk by chunk on every call, only one chunk alive at a time."""

    def __init__(self, split: StemSplit, inputs: RoundInputs, compute: Compute, memory: Memory) -> None:
        self.split, self.inputs, self.compute, self.memory = split, inputs, compute, memory
        self.cache: list[Chunk] | None = None
        self._floats: int | None = None

    @property
    def cached(self) -> bool:
        return self.cache is not None

    def floats_per_sample(self) -> int:
        """Numbers in one sample's stem output."""
        if self._floats is None:
            split = self.split
            self._floats = int(split.stem(split.prepare(self.inputs.x_val[:1])).numel())
        return self._floats

    def compute_chunk(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Stem outputs of a validation chunk for w_t, shape (n, *F), and per delta, (m, n, *F)."""
        split, inputs, m = self.split, self.inputs, self.inputs.m
        prepared = split.prepare(x)
        glob = inputs.global_params
        stacked = {
            k: inputs.delta_matrix(full).reshape(-1, *glob[full].shape[1:])
            for k, full in split.stem_names.items()
        }
        with self.compute.autocast():
            base = functional_call(
                split.stem, {k: glob[full] for k, full in split.stem_names.items()}, (prepared,)
            )
            out = functional_call(split.stem, stacked, (prepared,))  # (n, m*out, ...) or (n, ..., m*out)
        # Kept and combined per coalition in the inputs' dtype (no-ops unless autocast made them bf16).
        base, out = base.to(x.dtype), out.to(x.dtype)
        dim = split.stem_output_dim()
        out = out.unflatten(dim, (m, -1)).movedim(dim if dim >= 0 else dim - 1, 0)
        return base, out.contiguous()

    def chunks(self, chunk: int) -> Iterable[Chunk]:
        """(start, w_t's outputs, per-delta outputs) per validation chunk of `chunk` samples."""
        if self.cache is not None:
            return self.cache
        x = self.inputs.x_val
        starts = range(0, x.shape[0], chunk)
        if self.floats_per_sample() * x.shape[0] * (self.inputs.m + 1) <= self.memory.budget_floats:
            self.cache = [(s, *self.compute_chunk(x[s : s + chunk])) for s in starts]
            return self.cache
        return ((s, *self.compute_chunk(x[s : s + chunk])) for s in starts)
