"""The fused head kernel on the CPU, under Triton's interpreter: run as a script with TRITON_INTERPRET=1.

`python -m tests.support.interpreted_kernel` prints one JSON object: for random heads of awkward sizes,
the kernel's correct counts per label and those of a float64 reference; and for a real round game of the
paper's MLP, per coalition and label, the kernel's counts through FusedHead and the layer-by-layer
head's (StackedHead).
The environment variable must be set before Triton is imported, hence a process of its own.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from fedsv.task.models import build_model
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import all_coalitions
from fedsv.valuation.round.executors import Compute, fused_head
from fedsv.valuation.round.executors.fast import FastExecutor, FusedHead
from fedsv.valuation.round.round_inputs import by_cell, coalition_weights

SIZES = [(70, 40, 72, 3), (5, 16, 16, 16), (130, 200, 200, 10)]
"""(samples, stem width, hidden width, classes): not multiples of the kernel's blocks, and the MLP's."""


def random_heads() -> list[dict[str, list[int] | list[list[int]]]]:
    out = []
    for n, d1, d2, classes in SIZES:
        gen = torch.Generator().manual_seed(n)
        batch = 5

        def rand(*shape: int, gen: torch.Generator = gen) -> torch.Tensor:
            return torch.randn(*shape, generator=gen)

        h1 = torch.relu(rand(batch, n, d1))
        params = {"1.weight": rand(batch, d2, d1) / d1**0.5, "1.bias": rand(batch, d2) * 0.1}
        params |= {"3.weight": rand(batch, classes, d2) / d2**0.5, "3.bias": rand(batch, classes) * 0.1}
        y = torch.randint(0, classes, (n,), generator=gen)
        folds = 1 if n == SIZES[0][0] else 3  # the labels alone, or (label, fold) cells
        cells = y * folds + torch.randint(0, folds, (n,), generator=gen)
        plan = fused_head.FusedMLPHead("1.weight", "1.bias", "3.weight", "3.bias", classes)
        p64 = {k: v.double() for k, v in params.items()}
        hidden = torch.relu(torch.baddbmm(p64["1.bias"][:, None], h1.double(), p64["1.weight"].mT))
        logits = torch.baddbmm(p64["3.bias"][:, None], hidden, p64["3.weight"].mT)
        expected = by_cell((logits.argmax(-1) == y).double(), cells, classes * folds)
        if folds == 1:
            got = fused_head.correct_counts(plan, h1, params, y, "tf32")
        else:
            got = fused_head.correct_counts(plan, h1, params, y, "tf32", cells, classes * folds)
        out.append({"n": [n], "kernel": got.tolist(), "reference": expected.long().tolist()})
    return out


def round_game() -> dict[str, list[list[float]]]:
    """Every coalition of a 6-participant round of the paper's MLP: the fused kernel against the head
    the game runs on the CPU (stacked matmul), from the same stem outputs."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    deltas = [{k: 0.05 * torch.randn_like(v) for k, v in params.items()} for _ in range(6)]
    x, y = torch.rand(300, 1, 28, 28), torch.randint(0, 10, (300,))
    game = RoundGame(model, params, deltas, [10, 20, 30, 40, 50, 60], x, y)
    executor = game.executor
    assert isinstance(executor, FastExecutor)
    plan = fused_head.shape_of(executor.split.head)
    assert plan is not None, "the paper's MLP has the fused kernel's head"
    # The kernel's products are TF32 on a GPU; the interpreter computes them in float32 on the CPU.
    tf32 = Compute(game.compute.model, game.compute.device, "tf32")
    fused = FusedHead(executor.split, game.inputs, tf32, plan)
    coeffs = coalition_weights(all_coalitions(game.m), game.inputs)
    with game.compute.computing():
        chunk, _ = executor.chunking()
        kernel = torch.zeros((coeffs.shape[0], game.inputs.width), dtype=torch.float64)
        layered = torch.zeros((coeffs.shape[0], game.inputs.width), dtype=torch.float64)
        for start, base, per_delta in executor.stems.chunks(chunk):
            stop = start + base.shape[0]
            labels, cells = game.inputs.y_val[start:stop], game.inputs.cells(start, stop)
            kernel += fused.score(coeffs, base, per_delta, labels, cells)
            layered += executor.head.score(coeffs, base, per_delta, labels, cells)
    return {"kernel": kernel.tolist(), "layered": layered.tolist()}


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps({"random": random_heads(), "round": round_game(), "numpy": np.__version__}))


if __name__ == "__main__":
    main()
