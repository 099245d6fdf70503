"""Mode "fast": a linear stem's outputs combined per coalition, then the head for a batch of coalitions.

The head runs one of three ways (FastExecutor.head): stacked parameters with batched matmul
(stacked_head) where every head layer is supported; torch.func.vmap where one is not; or, on CUDA in
TF32 for accuracy, the fused Triton kernel for a ReLU-Linear-ReLU-Linear head (fused_head).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedsv.valuation.round.executors import fused_head, stacked_head
from fedsv.valuation.round.executors.base import Executor
from fedsv.valuation.round.executors.compute import Compute, Memory, coalition_state
from fedsv.valuation.round.executors.stem import StemOutputs
from fedsv.valuation.round.executors.stem_split import StemSplit
from fedsv.valuation.round.round_inputs import RoundInputs, score_logits

MAX_CUDA_BATCH = 4096
"""Most coalitions per head batch on CUDA (fewer launches; the working set bounds it first)."""


def stem_sums(c: Tensor, base: Tensor, per_delta: Tensor, relu: bool = False) -> Tensor:
    """Each coalition's stem output H_0 + sum_i c_i H_i, (B, *F); `relu` fuses the head's first ReLU
    into the product (torch._addmm_activation: a cuBLASLt epilogue on CUDA, the same code on the CPU)."""
    m = per_delta.shape[0]
    if relu:
        h = torch._addmm_activation(base.reshape(-1), c, per_delta.reshape(m, -1))
    else:
        h = torch.addmm(base.reshape(1, -1), c, per_delta.reshape(m, -1))
    return h.reshape(c.shape[0], *base.shape)


class Head(ABC):
    """How the layers after the stem run for a batch of coalitions."""

    name: str

    def __init__(self, split: StemSplit, inputs: RoundInputs, compute: Compute) -> None:
        self.split, self.inputs, self.compute = split, inputs, compute

    @abstractmethod
    def score(self, c: Tensor, base: Tensor, per_delta: Tensor, y: Tensor, cells: Tensor) -> Tensor:
        """Per-sample scores of a chunk's samples with labels y, summed per cell (RoundInputs.cells):
        (B, width) float64."""

    def state(self, rel: str, c: Tensor) -> Tensor:
        """A head tensor (by its name relative to the head) of every coalition in the batch."""
        return coalition_state(self.inputs, self.split.head_names[rel], c)


class StackedHead(Head):
    """Stacked parameters with batched matmul, layer by layer (stacked_head)."""

    name = "stacked matmul"

    def logits(self, c: Tensor, base: Tensor, per_delta: Tensor) -> Tensor:
        head = self.split.head
        assert isinstance(head, nn.Sequential)  # the planner checked stacked_head.supports

        def param(rel: str) -> Tensor:
            with self.compute.exact():
                return self.state(rel, c)

        first = 1 if len(head) and isinstance(head[0], nn.ReLU) else 0  # fused into the stem sum
        h = stem_sums(c, base, per_delta, relu=first == 1)
        with self.compute.autocast():
            return stacked_head.run_stacked(head, param, h, first)

    def score(self, c: Tensor, base: Tensor, per_delta: Tensor, y: Tensor, cells: Tensor) -> Tensor:
        return score_logits(self.logits(c, base, per_delta), y, self.inputs.metric, cells, self.inputs.width)


class VmapHead(Head):
    """The head's own forward under torch.func.vmap (a layer the stacked executor does not implement)."""

    name = "vmap (a layer the stacked executor does not implement)"

    def logits(self, c: Tensor, base: Tensor, per_delta: Tensor) -> Tensor:
        head = self.split.head

        def run_head(state: dict[str, Tensor], inputs: Tensor) -> Tensor:
            return functional_call(head, state, (inputs,))

        h = stem_sums(c, base, per_delta)  # in the inputs' dtype, before autocast
        state = {rel: self.state(rel, c) for rel in self.split.head_names}
        with self.compute.autocast():
            return vmap(run_head)(state, h)

    def score(self, c: Tensor, base: Tensor, per_delta: Tensor, y: Tensor, cells: Tensor) -> Tensor:
        return score_logits(self.logits(c, base, per_delta), y, self.inputs.metric, cells, self.inputs.width)


class FusedHead(Head):
    """The fused Triton kernel: ReLU'd stem sums in, each coalition's correct predictions out."""

    name = "the fused kernel (fused_head)"

    def __init__(
        self, split: StemSplit, inputs: RoundInputs, compute: Compute, fused: fused_head.FusedMLPHead
    ):
        super().__init__(split, inputs, compute)
        self.fused = fused

    def score(self, c: Tensor, base: Tensor, per_delta: Tensor, y: Tensor, cells: Tensor) -> Tensor:
        """The kernel counts per (label, fold) cell, in one launch over the chunk's samples."""
        f = self.fused
        params = {
            rel: self.state(rel, c) for rel in (f.hidden_weight, f.hidden_bias, f.out_weight, f.out_bias)
        }
        h1 = stem_sums(c, base, per_delta, relu=True)
        counts = fused_head.correct_counts(f, h1, params, y, self.compute.precision, cells, self.inputs.width)
        return counts.to(torch.float64)


class FastExecutor(Executor):
    """Mode "fast": StemOutputs once per round, then `head` per (validation chunk, coalition batch)."""

    mode = "fast"

    def __init__(
        self, inputs: RoundInputs, compute: Compute, memory: Memory, split: StemSplit, head: Head
    ) -> None:
        super().__init__(inputs, compute, memory)
        self.split, self.head = split, head
        self.stems = StemOutputs(split, inputs, compute, memory)

    @property
    def how(self) -> str:
        return f"{self.split.description}; head by {self.head.name}"

    def chunking(self) -> tuple[int, int]:
        """(validation samples per stem chunk, coalitions per head batch)."""
        features = self.stems.floats_per_sample()
        n, m = self.inputs.num_samples, self.inputs.m
        budget, working_set = self.memory.budget_floats, self.memory.working_set
        cuda = self.compute.device.type == "cuda"
        if any(isinstance(layer, nn.Conv2d) for layer in self.split.head.modules()):
            chunk = max(1, min(n, budget // (8 * features * (m + 1))))
            if not cuda:  # one convolution per coalition (stacked_head): big sample chunks, few coalitions
                return chunk, 8
            # One grouped convolution per batch: as many coalitions as a working set of activations holds.
            return chunk, max(4, min(MAX_CUDA_BATCH, working_set // (4 * chunk * features)))
        # Matmul heads: keep a batch's activations cache-sized (on CUDA: a working set of device memory).
        chunk = max(1, min(n, working_set // (16 * features)))
        cap = MAX_CUDA_BATCH if cuda else 256
        return chunk, max(1, min(cap, working_set // (chunk * features)))

    def prepare(self) -> None:
        if not self.stems.cached:
            with self.compute.computing():
                for _ in self.stems.chunks(self.chunking()[0]):
                    pass

    def totals(self, coeffs: Tensor) -> Tensor:
        totals = torch.zeros(
            (coeffs.shape[0], self.inputs.width), dtype=torch.float64, device=self.compute.device
        )
        y = self.inputs.y_val
        chunk, batch = self.chunking()
        for start, base, per_delta in self.stems.chunks(chunk):
            stop = start + base.shape[0]
            labels, cells = y[start:stop], self.inputs.cells(start, stop)
            for b0 in range(0, coeffs.shape[0], batch):
                c = coeffs[b0 : b0 + batch]
                totals[b0 : b0 + batch] += self.head.score(c, base, per_delta, labels, cells)
        return totals
