"""Per-round latency and bytes of real `fedsv launch` runs: valuation pipelined, inline and off.

Usage: python benchmarks/bench_rounds.py [--participants 50] [--fraction 0.2] [--rounds 5] [--out DIR]
                                         [--valuation auto]

Runs the paper's setting scaled to the embedded data (m = 10 of N = 50, MLP) three times through the
real runtime (coordinator + participant processes on loopback), same seed: FedSV (--valuation, auto by
default: exact when it fits the per-round time budget measured on the round's game) valued in the
background while the next round trains (pipelined, the default), valued before the next round
(inline), and valuation off. Prints one table of per-round phase medians and bytes side by side,
and the methods the rounds were valued with.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedsv.app.launch import Launch, LaunchConfig
from fedsv.ledger import Ledger, RoundRecord
from fedsv.settings.choices import ValuationMethod, ValuationSchedule
from fedsv.settings.run import RunConfig


def run_once(run: RunConfig, out: Path, schedule: str) -> tuple[list[RoundRecord], float]:
    launch = Launch(
        run, LaunchConfig(out=str(out), metrics_port=-1, valuation_schedule=ValuationSchedule(schedule))
    )
    started = time.perf_counter()
    try:
        launch.start()
        code = launch.follow(lambda line: print("   ", line, flush=True))
    finally:
        launch.stop()
    if code != 0:
        raise SystemExit(f"run failed with exit code {code}; see {out}/coordinator.log")
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        return ledger.rounds(), time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(records: list[RoundRecord]) -> dict[str, float]:
    """Medians over rounds; round 1 is left out of the timings (processes warming up)."""
    timed = records[1:] or records
    return {
        "local training (slowest)": median([r.local_train_seconds for r in timed]),
        "wait incl. transfer": median([r.train_wait_seconds - r.local_train_seconds for r in timed]),
        "aggregation": median([r.aggregation_seconds for r in timed]),
        "valuation": median([r.valuation_seconds for r in timed]),
        "test evaluation": median([r.evaluation_seconds for r in timed]),
        "round total": median([r.round_seconds for r in timed]),
        "utility evaluations": median([float(r.evaluations) for r in timed]),
        "bytes up / round": median([float(r.bytes_up) for r in records]),
        "bytes down / round": median([float(r.bytes_down) for r in records]),
        "messages / round": median([float(r.messages_up + r.messages_down) for r in records]),
        "physical minimum bytes": median([float(r.physical_minimum_bytes) for r in records]),
        "ratio to minimum": median([r.bytes_ratio_to_minimum or float("nan") for r in records]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=50)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--valuation",
        default="auto",
        help="method of the pipelined and inline runs (auto: exact if it fits the run's default "
        "--valuation-budget-seconds on each round's game, else sampling)",
    )
    args = parser.parse_args()
    print(f"command: {' '.join(sys.argv)}")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    base = Path(args.out or tempfile.mkdtemp(prefix="fedsv-bench-rounds-"))
    results: dict[str, dict[str, float]] = {}
    for label, valuation, schedule in (
        ("pipelined", args.valuation, "pipelined"),
        ("inline", args.valuation, "inline"),
        ("none", "none", "pipelined"),
    ):
        run = RunConfig(
            participants=args.participants,
            fraction=args.fraction,
            rounds=args.rounds,
            valuation=ValuationMethod(valuation),
        )
        print(f"run {label}: valuation={valuation} (m = {run.selected_per_round} of N = {run.participants}):")
        print(f"  valuation budget {run.valuation_budget_seconds} s per round, measured on each round's game")
        records, wall = run_once(run, base / label, schedule)
        assert all(not r.pending for r in records), "every round has its values when the run ends"
        results[label] = summarize(records)
        print(f"  methods: {sorted({r.method for r in records})}")
        results[label]["whole run (s)"] = wall
    print()
    columns = f"{'pipelined':>12} {'inline':>12} {'none':>12} {'pipe/none':>10} {'inline/none':>11}"
    print(f"{'per round (median)':<28} {columns}")
    for key in results["none"]:
        p, i, n = results["pipelined"][key], results["inline"][key], results["none"][key]
        ratios = [f"{x / n:10.3f}" if n else f"{'-':>10}" for x in (p, i)]
        unit = "" if "bytes" in key or "messages" in key or "ratio" in key or "evaluations" in key else " s"
        print(f"{key + unit:<28} {p:12.4f} {i:12.4f} {n:12.4f} {ratios[0]} {ratios[1]:>11}")
    same = all(
        results[label][k] == results["none"][k]
        for label in ("pipelined", "inline")
        for k in ("bytes up / round", "bytes down / round", "messages / round")
    )
    print(f"\nidentical bytes and messages with and without valuation: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
