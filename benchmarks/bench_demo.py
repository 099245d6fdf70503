"""`make demo` against the same run without valuation: round times, the wait for the values, exactness.

Usage: python benchmarks/bench_demo.py [--repeats 3] [--out DIR] [any run flag of `fedsv launch`]

Runs the demo's settings (`fedsv launch` defaults: 20 participants, 10 per round, 5 rounds, MLP on the
embedded MNIST sample) through the real runtime, alternating the default valuation (auto: exact for
m = 10, valued by the idle-priority valuation process while the next round trains) with `--valuation
none`, `--repeats` times each in one sitting, and once more with `--valuation exact
--valuation-schedule inline` as the reference. Prints per configuration the median round time (rounds
2..T; round 1 warms the processes up), its ratio to the run without valuation, the seconds from the
last round's commit to the final report, and the largest difference of any participant's FedSV total
from the exact reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fixtures import load_average, machine, print_table

from fedsv.app.launch import Launch, LaunchConfig
from fedsv.app.report_files import write_outputs
from fedsv.ledger import Ledger, federated_valuation
from fedsv.settings.choices import ValuationSchedule
from fedsv.settings.run import RunConfig
from fedsv.settings.sources import ProcessSettings, add_settings, load_settings


class RunSettings(ProcessSettings, RunConfig):
    """The run's settings, from flags, --config and FEDSV_* as `fedsv launch` reads them."""


@dataclass
class Measured:
    """One run: its rounds' times, the wait from the last round's commit to the report, its totals."""

    round_seconds: list[float]
    report_wait: float
    totals: dict[str, float]
    methods: set[str]
    evaluations: list[int]


def run_once(run: RunConfig, out: Path, schedule: str = "pipelined") -> Measured:
    launch = Launch(
        run,
        LaunchConfig(out=str(out), metrics_port=-1, valuation_schedule=ValuationSchedule(schedule), linger=0),
    )
    try:
        launch.start()
        code = launch.follow(lambda line: None)
    finally:
        launch.stop()
    if code != 0:
        raise SystemExit(f"run failed with exit code {code}; see {out}/coordinator.log")
    write_outputs(out)
    reported = time.time()
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        records, rows = ledger.rounds(), ledger.values()
    totals = federated_valuation(records, rows).totals()["fedsv"]
    return Measured(
        [r.round_seconds for r in records[1:]],
        reported - records[-1].finished_at,
        totals,
        {r.method for r in records},
        [r.evaluations for r in records],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    source = add_settings(parser, RunSettings)
    args = parser.parse_args(argv)
    run = load_settings(RunSettings, source, args).part(RunConfig)
    base = Path(args.out or tempfile.mkdtemp(prefix="fedsv-bench-demo-"))
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {machine()}; load average at start {load_average()}")
    print(f"run: {run.participants} participants, {run.selected_per_round} per round, {run.rounds} rounds\n")
    reference = run_once(RunConfig(**{**run.to_dict(), "valuation": "exact"}), base / "exact", "inline")
    runs: dict[str, list[Measured]] = {"default": [], "none": []}
    for repeat in range(args.repeats):
        for label, valuation in (("default", run.valuation), ("none", "none")):
            config = RunConfig(**{**run.to_dict(), "valuation": valuation})
            runs[label].append(run_once(config, base / f"{label}-{repeat}"))
            print(f"  repeat {repeat + 1}/{args.repeats}: {label} done", flush=True)
    baseline = statistics.median(s for m in runs["none"] for s in m.round_seconds)
    rows = []
    for label, measured in (*runs.items(), ("exact inline (reference)", [reference])):
        rounds = statistics.median(s for m in measured for s in m.round_seconds)
        wait = statistics.median(m.report_wait for m in measured)
        if label == "none":
            diff = "-"
        else:
            worst = max(abs(m.totals[p] - reference.totals[p]) for m in measured for p in reference.totals)
            diff = f"{worst:.2e}"
        methods = ", ".join(sorted(set().union(*(m.methods for m in measured))))
        evaluations = statistics.median(e for m in measured for e in m.evaluations)
        rows.append(
            [
                label,
                methods,
                f"{evaluations:.0f}",
                f"{rounds:.3f}",
                f"{rounds / baseline:.2f}x",
                f"{wait:.2f}",
                diff,
            ]
        )
    print()
    header = ["valuation", "method", "evals/round", "median round s", "vs none", "last round -> report s",
              "max |total - exact|"]  # fmt: skip
    print_table(header, rows)
    print(f"rounds timed: 2..{run.rounds} of {args.repeats} runs each; load average at end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
