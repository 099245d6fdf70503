"""Benchmark of one round's federated-SV valuation: exact FedSV per RoundGame mode, sampling estimators."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from fixtures import RealRound, cpu_model, load_average, print_table, timed, to_cifar_shape, train_round

from fedsv.data import load_dataset
from fedsv.fl.device import resolve_device
from fedsv.valuation import plan, shapley_values
from fedsv.valuation.estimators.spec import ValuationSpec

VALUE_TOLERANCE = 1e-6
"""Largest allowed |value - naive value| of any participant, any mode."""

MIN_FAST_OVER_NAIVE = 4.0
"""Required speed-up of mode "fast" over mode "naive" for exact FedSV of the MLP round."""

EPS_LADDER = (0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
"""Accuracies tried in order when a sampling cell would run past its time budget."""


# --------------------------------------------------------------------------- part A


@dataclass
class ExactCase:
    """One model's exact-FedSV timing: the round, its size and the modes timed."""

    label: str
    rnd: RealRound
    num_val: int
    m: int
    modes: tuple[str, ...]
    check_ratio: bool


def run_exact_case(case: ExactCase, repeats: int, failures: list[str]) -> tuple[list[list[str]], np.ndarray]:
    """Time exact FedSV per mode (fresh game per repeat, modes interleaved); rows of the table."""
    seconds: dict[str, list[float]] = {mode: [] for mode in case.modes}
    values: dict[str, list[np.ndarray]] = {mode: [] for mode in case.modes}
    evaluations: dict[str, int] = {}
    for _ in range(repeats):
        for mode in case.modes:
            game = case.rnd.game(mode, case.num_val, case.m)
            assert game.mode == mode, f"{case.label}: mode {mode} fell back to {game.mode}"
            elapsed, result = timed(partial(shapley_values, game, spec=ValuationSpec(method="exact")))
            seconds[mode].append(elapsed)
            values[mode].append(result.values)
            evaluations[mode] = game.evaluations
    reference = values["naive"][0]
    naive_s = statistics.median(seconds["naive"])
    rows = []
    for mode in case.modes:
        median = statistics.median(seconds[mode])
        diff = max(float(np.max(np.abs(v - reference))) for v in values[mode])
        ratio = naive_s / median
        rows.append(
            [
                case.label,
                str(case.num_val),
                str(case.m),
                mode,
                f"{median:.3f}",
                str(evaluations[mode]),
                f"{1000 * median / evaluations[mode]:.3f}",
                f"{ratio:.2f}x",
                f"{diff:.1e}",
            ]
        )
        if diff > VALUE_TOLERANCE:
            failures.append(
                f"{case.label} {mode}: values differ from naive by {diff:.2e} > {VALUE_TOLERANCE}"
            )
        if case.check_ratio and mode == "fast" and ratio < MIN_FAST_OVER_NAIVE:
            failures.append(f"{case.label}: fast/naive speed-up {ratio:.2f}x < {MIN_FAST_OVER_NAIVE}x")
    return rows, reference


# --------------------------------------------------------------------------- part B


def probe_cost(rnd: RealRound, probe: int = 512) -> tuple[float, float]:
    """(seconds once per game, seconds per coalition) of a fresh fast game, measured on random coalitions.

    The first small batch pays the per-round stem outputs; the second batch gives the marginal cost.
    """
    game = rnd.game("fast")
    rows = np.random.default_rng(123).random((probe + 32, rnd.m)) < 0.5
    start = time.perf_counter()
    game.utilities(rows[:32])
    first = time.perf_counter()
    before = game.evaluations
    game.utilities(rows[32:])
    per_coalition = (time.perf_counter() - first) / max(1, game.evaluations - before)
    return max(0.0, first - start - before * per_coalition), per_coalition


def choose_eps(
    method: str, m: int, eps: float, delta: float, cost: tuple[float, float], budget_s: float, repeats: int
) -> float:
    """The smallest eps (eps itself, then the ladder) whose planned evaluations fit the cell's time budget."""
    fixed, per_coalition = cost
    for candidate in (eps, *(e for e in EPS_LADDER if e > eps)):
        planned = plan(m, ValuationSpec(method=method, eps=candidate, delta=delta)).evaluations
        if (fixed + planned * per_coalition) * repeats <= budget_s:
            return candidate
    return EPS_LADDER[-1]


def run_sampling(
    rounds: dict[int, RealRound],
    exact_values: np.ndarray,
    eps: float,
    delta: float,
    repeats: int,
    budget_s: float,
) -> list[list[str]]:
    rows = []
    for m, rnd in rounds.items():
        cost = probe_cost(rnd)
        for method in ("permutation", "group_testing"):
            cell_eps = choose_eps(method, m, eps, delta, cost, budget_s, repeats)
            planned = plan(m, ValuationSpec(method=method, eps=cell_eps, delta=delta)).evaluations
            seconds, evaluations, errors = [], [], []
            for repeat in range(repeats):
                game = rnd.game("fast")
                elapsed, result = timed(
                    partial(shapley_values, game, spec=ValuationSpec(method, cell_eps, delta, seed=repeat))
                )
                seconds.append(elapsed)
                evaluations.append(result.evaluations)
                if m == exact_values.shape[0]:
                    errors.append(float(np.max(np.abs(result.values - exact_values))))
            rows.append(
                [
                    str(m),
                    method,
                    f"{cell_eps:g}" + ("" if cell_eps == eps else " *"),
                    str(planned),
                    str(2**m) if m <= ValuationSpec().max_exact_players else f"2^{m}",
                    str(int(statistics.median(evaluations))),
                    f"{statistics.median(seconds):.2f}",
                    f"{max(errors):.4f}" if errors else "-",
                ]
            )
            print(f"  m={m} {method}: eps {cell_eps:g}, {statistics.median(seconds):.2f} s", flush=True)
    return rows


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    import gpu_exact

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed repeats per cell (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller CNN games and a tighter sampling budget"
    )
    parser.add_argument("--eps", type=float, default=0.05, help="target accuracy of the sampling estimators")
    parser.add_argument(
        "--delta", type=float, default=0.05, help="failure probability of the sampling estimators"
    )
    parser.add_argument(
        "--cell-budget",
        type=float,
        default=None,
        help="seconds (all repeats) a sampling cell may take, else larger eps (default 75; 10 with --quick)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="where round games compute: cpu | cuda[:N] | auto")
    parser.add_argument("--precision", default="fp32", help="fp32 | tf32 | bf16 (see docs/performance.md)")
    gpu_exact.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.cell_budget is None:
        args.cell_budget = 10.0 if args.quick else 75.0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import gpu_exact

    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if resolve_device(args.device).type == "cuda":  # the GPU suite: exact FedSV of rounds up to m = 24
        print(f"command: python {shlex.join(sys.argv)}", flush=True)
        return gpu_exact.run_suite(args)
    started = time.perf_counter()
    print(f"command: python {shlex.join(sys.argv)}")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs "
        f"({cpu_model()}), python {platform.python_version()}, {platform.system()} {platform.machine()}"
    )
    print(f"load average at start {load_average()}")
    print(f"repeats {args.repeats} (median reported), fresh RoundGame per repeat\n", flush=True)

    splits = load_dataset("embedded", seed=0, validation_size=1000)
    x_tr, y_tr = splits.train.x, splits.train.y
    x_val, y_val = splits.validation.x, splits.validation.y
    mlp = train_round("mlp", x_tr, y_tr, x_val, y_val, participants=10)
    cnn = train_round("cnn_mnist", x_tr, y_tr, x_val, y_val, participants=10)
    cifar = train_round(
        "cnn_cifar", to_cifar_shape(x_tr), y_tr, to_cifar_shape(x_val), y_val, participants=10
    )
    for rnd in (mlp, cnn, cifar):
        rnd.device, rnd.precision = args.device, args.precision
    print(f"round games on {args.device} in {args.precision}")
    print("rounds (real local training on the embedded MNIST sample):")
    for rnd in (mlp, cnn, cifar):
        print(f"  {rnd.describe}")
    print("  cnn_cifar runs on the embedded digits padded to 32x32 and replicated to 3 channels")
    print(f"  ({time.perf_counter() - started:.1f} s to load and train)\n", flush=True)

    failures: list[str] = []
    cases = [
        ExactCase("MLP", mlp, 1000, 10, ("fast", "batched", "naive"), check_ratio=True),
        ExactCase(
            "MnistCNN", cnn, 64 if args.quick else 200, 6 if args.quick else 10, ("fast", "naive"), False
        ),
        ExactCase(
            "CifarCNN", cifar, 32 if args.quick else 100, 6 if args.quick else 8, ("fast", "naive"), False
        ),
    ]
    rows: list[list[str]] = []
    exact_mlp = np.zeros(0)
    for case in cases:
        case_rows, reference = run_exact_case(case, args.repeats, failures)
        rows.extend(case_rows)
        if case.label == "MLP":
            exact_mlp = reference
        print(f"  {case.label}: done", flush=True)
    print("\nPart A - exact FedSV of one round (all 2^m coalitions, ValuationSpec(method='exact'))\n")
    print_table(
        ["model", "val n", "m", "mode", "median s", "evaluations", "ms/coalition", "vs naive", "max abs dv"],
        rows,
    )

    print("Part B - sampling estimators on real MLP rounds (mode 'fast', 1000 validation samples)")
    started_b = time.perf_counter()
    sampling_rounds: dict[int, RealRound] = {10: mlp}
    for m in (20, 50):
        sampling_rounds[m] = train_round("mlp", x_tr, y_tr, x_val, y_val, participants=m)
    for m in (20, 50):
        print(f"  m={m}: {sampling_rounds[m].describe}")
    b_rows = run_sampling(sampling_rounds, exact_mlp, args.eps, args.delta, args.repeats, args.cell_budget)
    print(
        f"\ndelta = {args.delta}, utility range 1; '*' = eps raised from {args.eps} so that the cell "
        f"fits its {args.cell_budget:g} s budget ({args.repeats} repeats); "
        "planned = plan(m, ValuationSpec(method=method, eps=eps, delta=delta)).evaluations; "
        "max abs err = worst over repeats (seeds 0..repeats-1) vs the exact values of Part A\n"
    )
    print_table(
        ["m", "method", "eps", "planned", "exact", "distinct evals", "median s", "max abs err"],
        b_rows,
    )
    print(f"Part B: {time.perf_counter() - started_b:.1f} s; total {time.perf_counter() - started:.1f} s")
    print(f"load average at end {load_average()} (other processes on the machine slow every timing)")
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print(
        f"OK: all modes agree within {VALUE_TOLERANCE:g}; MLP fast/naive speed-up >= {MIN_FAST_OVER_NAIVE:g}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
