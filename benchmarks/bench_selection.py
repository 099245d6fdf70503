"""Balanced selection against the independent draw, on federations of equals.

Every member holds an IID shard of the embedded MNIST sample of the same size, and no one is corrupted:
every member is worth the same, so a fair payout pays each about 1/N. Each federation is run with both
selection rules (`--draw balanced`, the default; `--draw independent`, the paper's), the same seeds,
trained and valued exactly in this process as `fedsv launch` does. Per federation and rule it prints:

- runs in which some member was never selected (it has no value: held out of the payout);
- runs whose lowest share is at least 0.5/N, and whose highest is at most 2/N (by the recommended
  value, negative values paid nothing; a member never selected counts as paid nothing);
- runs in which the verdict finds a difference among the equals (its false-positive rate; level 5%);
- the mean and SD over seeds of the final test accuracy.

    python benchmarks/bench_selection.py --seeds 20          # the docs' table
    python benchmarks/bench_selection.py --seeds 4 --federations 20/10x5
    python benchmarks/bench_selection.py --seeds 20 --draws balanced   # the verdict's false positives
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

from fixtures import machine, print_table

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.valuation.accounting.verdict import owners_verdict

FEDERATIONS: dict[str, dict[str, Any]] = {
    "20/10x5": {"participants": 20, "fraction": 0.5, "rounds": 5},  # `fedsv launch`'s defaults
    "20/10x8e2": {"participants": 20, "fraction": 0.5, "rounds": 8, "epochs": 2},
    "6/3x8": {"participants": 6, "fraction": 0.5, "rounds": 8},
}
RECOMMENDED, VERDICT = "fedsv_shrunk", "fedsv_completed"


@dataclass(frozen=True)
class Outcome:
    """One run's payout and verdict."""

    never_selected: int
    lowest: float  # the lowest share times N
    highest: float  # the highest share times N
    distinguishes: bool
    accuracy: float


def run(federation: str, draw: str, seed: int) -> Outcome:
    settings = {**FEDERATIONS[federation], "seed": seed, "draw": draw, "valuation": "exact"}
    result = run_demo(DemoConfig(**settings))
    valuation = result.valuation
    n = int(settings["participants"])
    drawn = {pid for rv in valuation.per_round() for pid in (rv.selected or rv.participants)}
    totals = valuation.totals()
    paid = {pid: max(value, 0.0) if pid in drawn else 0.0 for pid, value in totals[RECOMMENDED].items()}
    pot = sum(paid.values()) or 1.0
    errors = valuation.between_errors()[VERDICT]
    known = {pid: totals[VERDICT][pid] for pid in drawn}
    verdict = owners_verdict(known, {pid: errors.get(pid) for pid in known}, [])
    return Outcome(
        n - len(drawn),
        n * min(paid.values()) / pot,
        n * max(paid.values()) / pot,
        bool(verdict.distinguishes),
        result.accuracies[-1],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--federations", default=",".join(FEDERATIONS))
    parser.add_argument("--draws", default="independent,balanced", help="the rules to run, comma-separated")
    args = parser.parse_args()
    started = time.time()
    rows = []
    for federation in args.federations.split(","):
        for draw in args.draws.split(","):
            found = [run(federation, draw, seed) for seed in range(args.seeds)]
            accuracy = [o.accuracy for o in found]
            spread = statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0
            rows.append(
                [
                    federation,
                    draw,
                    f"{sum(o.never_selected > 0 for o in found)} of {len(found)}",
                    f"{sum(o.lowest >= 0.5 for o in found)} of {len(found)}",
                    f"{sum(o.highest <= 2.0 for o in found)} of {len(found)}",
                    f"{min(o.lowest for o in found):.2f} / {max(o.highest for o in found):.2f}",
                    f"{sum(o.distinguishes for o in found)} of {len(found)}",
                    f"{statistics.mean(accuracy):.3f} ± {spread:.3f}",
                ]
            )
            print(f"{federation} {draw}: done ({time.time() - started:.0f} s)", flush=True)
    print(f"\n{machine()}; seeds 0-{args.seeds - 1}; {time.time() - started:.0f} s\n")
    print_table(
        [
            "federation",
            "draw",
            "some member never selected",
            "lowest share >= 0.5/N",
            "highest share <= 2/N",
            "lowest / highest share x N",
            "verdict finds a difference",
            "final accuracy",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
