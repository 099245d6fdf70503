"""Do the stated errors cover a rerun? One federation with fixed member data, rerun over seeds.

The tabular example's eight member files, each copied once: 16 members, 8 pairs of twins holding
identical data (member 5 and its twin with every label flipped). Every rerun uses another --seed (other
selections, other SGD orders) and a fresh validation set (a seeded bootstrap of validation.csv), so the
estimator's, the validation set's and the training's noise are all exercised. Per value it prints:

- sd/stated: the SD of a member's total across reruns over its mean stated standard error (median
  over members; 1 means the stated errors are the right size);
- twin gap: the mean |difference| between twins' totals over the mean absolute total;
- overlap: how often twins' 95% intervals overlap (pairs x reruns).

    python benchmarks/bench_calibration.py --seeds 10 --rounds 10
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from fedsv.app.report import build_report

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("fedsv_shrunk", "fedsv_completed", "fedsv", "fedsv_normalized", "loo")
Z95 = 1.959964


def prepare(work: Path, seeds: int) -> None:
    """The example's files, each member twice, and one bootstrap of the validation set per rerun."""
    data = ROOT / "examples/tabular/data"
    if not (data / "validation.csv").exists():
        subprocess.run([sys.executable, str(ROOT / "examples/tabular/prepare.py")], check=True)
    for rank in range(8):
        for copy in (rank, rank + 8):
            shutil.copy(data / f"member{rank}.csv", work / f"member{copy}.csv")
    shutil.copy(data / "test.csv", work / "test.csv")
    validation = pd.read_csv(data / "validation.csv")
    for seed in range(seeds):
        rng = np.random.default_rng(1000 + seed)
        validation.iloc[rng.integers(0, len(validation), len(validation))].to_csv(
            work / f"validation{seed}.csv", index=False
        )


def run(work: Path, seed: int, rounds: int) -> dict:
    """One rerun through `fedsv launch`; a finished run left in `work` by an earlier call is reported
    again from its ledger (so a change to how values and errors are taken is measured without training)."""
    out = work / f"run{seed}"
    if (out / "report.json").exists():
        return build_report(out)
    command = [
        str(Path(sys.executable).parent / "fedsv"), "launch",
        "--task", str(ROOT / "examples/tabular/task.py:task"),
        "--validation-data", str(work / f"validation{seed}.csv"), "--test-data", str(work / "test.csv"),
        "--data", str(work / "member{rank}.csv"), "--participants", "16", "--fraction", "0.5",
        "--rounds", str(rounds), "--valuation", "exact", "--seed", str(seed), "--insecure", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    return build_report(out)


def table(reports: list[dict]) -> str:
    ids = sorted(reports[0]["totals"]["fedsv"])
    twins = [(f"p{r:03d}", f"p{r + 8:03d}") for r in range(8)]
    lines = [
        "| value | sd / stated (median member) | twin gap / mean abs total | twins' 95% intervals overlap |",
        "|---|---|---|---|",
    ]
    for key in KEYS:
        totals = np.array([[rep["totals"][key][p] or 0.0 for p in ids] for rep in reports])
        errors = np.array([[rep["stderr"][key][p] for p in ids] for rep in reports], dtype=float)
        sd, stated = totals.std(axis=0, ddof=1), np.nanmean(errors, axis=0)
        # a member valued 0 in every rerun (turned away in every round) with a stated 0 agrees exactly
        spread = stated > 0
        ratio = float(np.median(sd[spread] / stated[spread]))
        col = {p: k for k, p in enumerate(ids)}
        gaps = [abs(totals[s, col[a]] - totals[s, col[b]]) for s in range(len(reports)) for a, b in twins]
        overlap = [
            abs(totals[s, col[a]] - totals[s, col[b]]) <= Z95 * (errors[s, col[a]] + errors[s, col[b]])
            for s in range(len(reports))
            for a, b in twins
        ]
        scale = float(np.mean(np.abs(totals)))
        lines.append(
            f"| `{key}` | {ratio:.2f} | {np.mean(gaps) / scale:.2f} | "
            f"{sum(overlap)} of {len(overlap)} ({np.mean(overlap):.0%}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default="", help="keep the runs here (and reuse those already there)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        work.mkdir(parents=True, exist_ok=True)
        prepare(work, args.seeds)
        reports = [run(work, seed, args.rounds) for seed in range(args.seeds)]
    print(f"{args.seeds} reruns x {args.rounds} rounds, 16 members (8 twin pairs), 8 per round, exact values")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}\n")
    print(table(reports))


if __name__ == "__main__":
    main()
