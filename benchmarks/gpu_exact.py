"""Exact FedSV of real rounds on a CUDA device: seconds, coalitions/s, TFLOP/s against the card's ceiling.

Run through `python benchmarks/bench_valuation.py --device cuda` (or this file alone, same flags). For
the paper's MLP at m = 10, 16, 20, 24 and the MNIST CNN at m = 10, 16 (1,000 validation images), each
precision: the end-to-end seconds of exact valuation on a fresh RoundGame (inputs moved to the device,
stem outputs, all 2^m coalitions, the Shapley sums; median of the repeats after one warm-up), the
coalitions per second, the FLOPs the game's kernels do (counted by torch's FlopCounterMode on a batch
of coalitions) over those seconds, and that rate against the matmul ceiling measured on this card in
the same precision. Values are compared with the CPU path: exact CPU values where 2^m is small
enough for the CPU (`--cpu-max-players`), else the utilities of 512 random coalitions on both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fixtures import RealRound, print_table, train_round
from torch.utils.flop_counter import FlopCounterMode

from fedsv.data import load_dataset
from fedsv.fl.device import resolve_device
from fedsv.task.models import build_model
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.games.game import members_of
from fedsv.valuation.round.device import tf32_allowed

CEILING_SIZE = 8192
"""Side of the square matmul that measures the card's ceiling in each precision."""

COMPARE_COALITIONS = 512
"""Random coalitions whose CPU and GPU utilities are compared where exact CPU values are too costly."""

ROUNDING = 1e-9
"""Utilities closer than this agree (summation order); an image flipping moves one by 1/n."""

CPU_FLOPS = 8e12
"""FLOPs of exact valuation the CPU comparison may spend; beyond, random coalitions are compared."""


@dataclass(frozen=True)
class GpuCase:
    """One exact valuation to time: a round, how many of its participants, and its label."""

    label: str
    rnd: RealRound
    m: int


@dataclass
class CaseTiming:
    """The measured seconds (all repeats), the values of the first repeat and the FLOPs per coalition."""

    seconds: list[float]
    values: np.ndarray
    flops_per_coalition: float


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: torch.device, precision: str, repeats: int = 10) -> float:
    """TFLOP/s of a large square matmul on random data, in fp32 (IEEE), tf32 or bf16."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    size = CEILING_SIZE if device.type == "cuda" else 1024
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = []
    with tf32_allowed(precision == "tf32") if device.type == "cuda" else nullcontext():
        for _ in range(3):
            a @ b
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            a @ b
            synchronize(device)
            times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e12


def flops_per_coalition(game: RoundGame, batch: int = 256) -> float:
    """FLOPs the game's kernels do per coalition (after its one-off stem outputs), counted by torch."""
    game.prepare()
    rows = np.random.default_rng(7).random((batch, game.m)) < 0.5
    with FlopCounterMode(display=False) as counter:
        game.evaluate_uncached(rows)
    return counter.get_total_flops() / batch


def game_of(case: GpuCase, device: str, **options: Any) -> RoundGame:
    """A fresh round game of the case's first m participants on `device` (RoundGame's options)."""
    rnd = case.rnd
    model = build_model(rnd.model_name, rnd.input_shape)
    m = case.m
    return RoundGame(
        model,
        rnd.global_params,
        rnd.deltas[:m],
        rnd.counts[:m],
        rnd.x_val,
        rnd.y_val,
        device=device,
        **options,
    )


def time_exact(
    case: GpuCase,
    device: str,
    precision: str,
    repeats: int,
    working_set: int | None = None,
    fused: bool = True,
) -> CaseTiming:
    """Exact FedSV on a fresh game per repeat; below m = 21 a first, untimed run warms cuBLAS/cuDNN up."""

    seconds: list[float] = []
    values, flops = np.zeros(0), 0.0
    warmup = case.m <= 20

    def make_game(fused: bool) -> RoundGame:
        return game_of(case, device, precision=precision, working_set_floats=working_set, fused=fused)

    for repeat in range(repeats + int(warmup)):
        synchronize(resolve_device(device))
        start = time.perf_counter()
        game = make_game(fused)
        result = ExactShapley(max_players=case.m).run(game)
        elapsed = time.perf_counter() - start
        if repeat == 0:
            values = result.values
            # The layer-by-layer head's kernels (the fused kernel does the same products; torch's
            # counter does not see inside a Triton kernel).
            flops = flops_per_coalition(make_game(fused=False))
        if repeat > 0 or not warmup:
            seconds.append(elapsed)
        del game
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return CaseTiming(seconds, values, flops)


def sweep_working_sets(case: GpuCase, device: str, precision: str, sizes: Sequence[int]) -> None:
    """Seconds of one exact valuation per working set (floats of activations per head batch)."""
    for size in sizes:
        timing = time_exact(case, device, precision, 3, working_set=size)
        print(f"  working set 2^{size.bit_length() - 1} floats: {statistics.median(timing.seconds):.3f} s")


def cpu_agreement(case: GpuCase, gpu: CaseTiming, device: str) -> str:
    """CUDA fp32 against the CPU: max |dvalue| where exact on the CPU takes at most CPU_FLOPS, else the
    utilities of random coalitions (as many as CPU_FLOPS / 10 allow, at most COMPARE_COALITIONS)."""
    cpu_game = case.rnd.game("fast", None, case.m)  # case.rnd.device is "cpu" here
    if gpu.flops_per_coalition * 2**case.m <= CPU_FLOPS:
        cpu_values = ExactShapley(max_players=case.m).run(cpu_game).values
        return f"max |dv| {np.abs(cpu_values - gpu.values).max():.1e}"
    count = int(min(COMPARE_COALITIONS, max(16, CPU_FLOPS / 10 / gpu.flops_per_coalition)))
    rows = members_of(np.random.default_rng(11).integers(0, 2**case.m, count), case.m)
    on_cpu = cpu_game.evaluate_uncached(rows)
    on_gpu = game_of(case, device).evaluate_uncached(rows)
    gap = np.abs(on_cpu - on_gpu)
    differ = int(np.sum(gap > ROUNDING))  # an accuracy differs by 1/n or more when an image flips
    return f"U of {count} coalitions: {differ} differ, max |dU| {float(gap.max()):.1e}"


def run_suite(args: argparse.Namespace) -> int:
    """Train the rounds, time every case in every precision, print the table."""
    device = resolve_device(args.device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        card = props.name
        print(f"device: {card}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")
    else:
        card = "CPU (a smoke run: the suite is meant for --device cuda)"
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    ceilings = {p: matmul_ceiling(device, p) for p in precisions}
    for p, tflops in ceilings.items():
        print(f"  measured matmul ceiling {p}: {tflops:.1f} TFLOP/s (square matmul, median of 10)")
    splits = load_dataset("embedded", seed=0, validation_size=1000)
    tr, va = splits.train, splits.validation
    started = time.perf_counter()
    mlp_sizes = [int(m) for m in args.mlp_players.split(",") if m]
    cnn_sizes = [int(m) for m in args.cnn_players.split(",") if m]
    rounds = {
        name: train_round(name, tr.x, tr.y, va.x, va.y, participants=max(sizes))
        for name, sizes in (("mlp", mlp_sizes), ("cnn_mnist", cnn_sizes))
        if sizes
    }
    for rnd in rounds.values():
        print(f"trained {rnd.describe}")
    print(f"({time.perf_counter() - started:.0f} s)\n")
    cases = [GpuCase("MLP", rounds["mlp"], m) for m in mlp_sizes if m <= 20]
    cases += [GpuCase("MnistCNN", rounds["cnn_mnist"], m) for m in cnn_sizes]
    cases += [GpuCase("MLP", rounds["mlp"], m) for m in mlp_sizes if m > 20]  # the longest last
    if args.working_sets and mlp_sizes:
        mlp = rounds["mlp"]
        sweep_case = GpuCase("MLP", mlp, min(16, max(mlp_sizes)))
        print(f"working sets, MLP m={sweep_case.m} in {precisions[-1]}:")
        sizes = [2 ** int(k) for k in args.working_sets.split(",")]
        sweep_working_sets(sweep_case, args.device, precisions[-1], sizes)
    rows: list[list[str]] = []
    for case in cases:
        for precision in precisions:
            repeats = 1 if case.m > 20 else args.repeats
            timing = time_exact(case, args.device, precision, repeats, fused=not args.no_fused)
            median = statistics.median(timing.seconds)
            rate = timing.flops_per_coalition * 2**case.m / median / 1e12
            agree = cpu_agreement(case, timing, args.device) if precision == "fp32" else ""
            rows.append(
                [
                    case.label,
                    str(case.m),
                    str(2**case.m),
                    precision,
                    f"{median:.3f}",
                    f"{2**case.m / median:,.0f}",
                    f"{timing.flops_per_coalition / 1e6:.1f}",
                    f"{rate:.1f}",
                    f"{100 * rate / ceilings[precision]:.0f}%",
                    agree,
                ]
            )
            print(f"  {case.label} m={case.m} {precision}: {median:.3f} s {agree}", flush=True)
    print(f"\nExact FedSV on {card}, 1,000 validation images, median of {args.repeats} (1 at m > 20)\n")
    print_table(
        [
            "model",
            "m",
            "coalitions",
            "precision",
            "seconds",
            "coalitions/s",
            "MFLOP/coal.",
            "TFLOP/s",
            "of ceiling",
            "vs CPU (fp32)",
        ],
        rows,
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's flags (bench_valuation adds them to its own)."""
    parser.add_argument("--precisions", default="fp32,tf32", help="GPU suite: comma-separated precisions")
    parser.add_argument("--mlp-players", default="10,16,20,24", help="GPU suite: MLP round sizes")
    parser.add_argument("--cnn-players", default="10,16", help="GPU suite: MNIST CNN round sizes")
    parser.add_argument(
        "--no-fused", action="store_true", help="GPU suite: the layer-by-layer head, not the fused kernel"
    )
    parser.add_argument(
        "--working-sets", default="", help="GPU suite: also time these log2 working sets (e.g. 20,22,24)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    add_arguments(parser)
    return run_suite(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
