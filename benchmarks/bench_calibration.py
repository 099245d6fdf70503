"""Do the stated errors cover a rerun, and do the amounts follow the data? Four federations, rerun.

Each federation of benchmarks/federations.py (fixed member files) is rerun over seeds: every rerun
another seed (selections, SGD orders, the initial model) and a fresh validation set (a seeded bootstrap
of the validation file), exact values every round, trained and valued in this process as `fedsv launch`
trains and values them (fedsv.app.demo.run_demo: the same selections, models and values). Per
federation and value it prints:

- sd/stated: the SD of a member's total across reruns over its mean stated standard error (median
  over members; 1 means the stated errors are the right size);
- twins: the mean |difference| between twins' totals over the mean absolute total, and how often
  twins' 95% intervals overlap (pairs x reruns);
- share RMSE: the RMSE of a run's payout shares (negative values paid nothing) against each member's
  expected share, and its ratio to that of `fedsv_completed`. The expected share is the same for every
  value: the member's mean share over the reruns by `fedsv_completed`, the expectation of FedSV over
  the selection (what the paper's value pays it on average). Against each value's own mean, a value
  that paid everyone alike would score 0 whatever the members' data.

    python benchmarks/bench_calibration.py --seeds 16 --rounds 10 --out runs/calibration
"""

from __future__ import annotations

import argparse
import pickle
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from federations import BUILDERS, Federation

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.valuation import FederatedValuation

KEYS = ("fedsv_shrunk", "fedsv_completed", "fedsv", "fedsv_normalized", "loo")
Z95 = 1.959964


def rerun(federation: Federation, work: Path, seed: int, rounds: int) -> FederatedValuation:
    """One rerun's accounting; the round values of one left in `work` by an earlier call are read back
    into a fresh accounting (so a change to how totals and errors are taken is measured without
    training again)."""
    kept = work / f"{federation.name}-run{seed}.pkl"
    if not kept.exists():
        settings = {**federation.rerun(work, seed), "rounds": rounds, "valuation": "exact"}
        done = run_demo(DemoConfig(**settings)).valuation
        with kept.open("wb") as f:
            pickle.dump((done.world, done.initial_scores, done.per_round()), f)
    with kept.open("rb") as f:
        world, initial, per_round = pickle.load(f)
    valuation = FederatedValuation(world, initial)
    for values in per_round:
        vars(values).setdefault("merged", [])  # kept before RoundValues had it: nothing was merged
        valuation.add_round(values)
    return valuation


def shares(totals: np.ndarray) -> np.ndarray:
    """Each run's payout shares (runs, members): negative values paid nothing."""
    paid = np.maximum(totals, 0.0)
    return paid / np.maximum(paid.sum(axis=1, keepdims=True), 1e-300)


def measures(federation: Federation, runs: list[FederatedValuation]) -> dict[str, dict[str, float]]:
    """Per value: sd/stated, twins' gap and overlap, and the share RMSE against the expected shares."""
    ids = runs[0].participants()
    col = {p: k for k, p in enumerate(ids)}
    out: dict[str, dict[str, float]] = {}
    plain = np.array([[run.totals()["fedsv_completed"][p] for p in ids] for run in runs])
    expected = shares(plain).mean(axis=0)
    for key in KEYS:
        totals = np.array([[run.totals()[key][p] for p in ids] for run in runs])
        errors = np.array([[run.errors()[key][p] for p in ids] for run in runs], dtype=float)
        sd, stated = totals.std(axis=0, ddof=1), np.nanmean(errors, axis=0)
        spread = np.isfinite(stated) & (stated > 0)
        paid = shares(totals)
        row = {
            "sd_stated": float(np.median(sd[spread] / stated[spread])),
            "rmse": float(np.sqrt(np.mean(np.square(paid - expected)))),
        }
        if federation.twins:
            pairs = [(col[a], col[b]) for a, b in federation.twins]
            gaps = [abs(totals[s, a] - totals[s, b]) for s in range(len(runs)) for a, b in pairs]
            overlap = [
                abs(totals[s, a] - totals[s, b]) <= Z95 * (errors[s, a] + errors[s, b])
                for s in range(len(runs))
                for a, b in pairs
            ]
            row["twin_gap"] = float(np.mean(gaps) / np.mean(np.abs(totals)))
            row["overlap"] = float(np.mean(overlap))
        out[key] = row
    return out


def table(federation: Federation, found: dict[str, dict[str, float]], reruns: int) -> str:
    base = found["fedsv_completed"]["rmse"]
    lines = [
        f"**{federation.name}** ({reruns} reruns; corrupted: {', '.join(federation.corrupted) or 'none'})",
        "",
        "| value | sd / stated | twin gap / mean abs total | twins' 95% intervals overlap | share RMSE "
        "| vs completed |",
        "|---|---|---|---|---|---|",
    ]
    for key, row in found.items():
        twin = ("-", "-") if "twin_gap" not in row else (f"{row['twin_gap']:.2f}", f"{row['overlap']:.0%}")
        lines.append(
            f"| `{key}` | {row['sd_stated']:.2f} | {twin[0]} | {twin[1]} | {row['rmse']:.4f} | "
            f"{row['rmse'] / base:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--federations", default=",".join(BUILDERS), help="comma-separated names")
    parser.add_argument("--out", default="", help="keep the reruns here (and reuse those already there)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.federations.split(","):
            federation = BUILDERS[name](work)
            started = time.perf_counter()
            runs = [rerun(federation, work, seed, args.rounds) for seed in range(args.seeds)]
            found = measures(federation, runs)
            seconds = time.perf_counter() - started
            print(f"\n{table(federation, found, len(runs))}\n({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
