"""Does joining twice pay? An owner's share once, and its two identities' combined share with a copy.

scikit-learn's digits in eight owners of 30 to 200 images (benchmarks/federations.py's digits owners,
without the twins), everyone selected in every round, exact values, 10 rounds; then the same owners plus
a ninth member holding a copy of owner K's file, valued apart and with redundant members merged
(--valuation-merge-redundant: updates far more alike than independent data give valued as one player,
and members merged in any round pooled as one owner for the run: fedsv/valuation/accounting/owners.py).
Per seed it prints owner K's payout share alone and its two identities' combined share, by each value
(negative values paid nothing), and their ratio (the target: at most 1.1 on the mean over seeds).

    python benchmarks/bench_payouts.py --part duplicates --seeds 4 --owner 4
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from federations import HERE, _digits_table, _write_digits

from fedsv.app.demo import DemoConfig, run_demo
from payouts.targets import Target

KEYS = ("fedsv_shrunk", "fedsv_completed", "fedsv", "loo")
SIZES = (30, 50, 70, 90, 120, 150, 160, 200)


def owners(work: Path, owner: int) -> None:
    """member0..7.csv: the eight owners; member8.csv: a copy of `owner`'s."""
    rest, _, _ = _write_digits(work, _digits_table())
    start = 0
    for rank, size in enumerate(SIZES):
        part = rest.iloc[start : start + size]
        start += size
        part.to_csv(work / f"member{rank}.csv", index=False)
        if rank == owner:
            part.to_csv(work / "member8.csv", index=False)


def shares(work: Path, members: int, seed: int, merge: bool = False) -> dict[str, dict[str, float]]:
    settings: dict[str, Any] = {
        "task": str(HERE / "federations.py:digits_task"), "data": str(work / "member{rank}.csv"),
        "validation_data": str(work / "validation.csv"), "test_data": str(work / "test.csv"),
        "participants": members, "fraction": 1.0, "rounds": 10, "seed": seed, "valuation": "exact",
        "valuation_merge_redundant": merge,
    }  # fmt: skip
    totals = run_demo(DemoConfig(**settings)).valuation.totals()
    out = {}
    for key in KEYS:
        paid = {pid: max(value, 0.0) for pid, value in totals[key].items()}
        pot = sum(paid.values()) or 1.0
        out[key] = {pid: value / pot for pid, value in paid.items()}
    return out


def run(seeds: int, owner: int) -> list[Target]:
    """Print the table; the target: the owner's two identities paid at most 1.1x the owner alone, on the
    mean over seeds, by the recommended value (apart, the default; and merged)."""
    me, copy = f"p{owner:03d}", "p008"
    hows = ("apart", "merged")
    ratios: dict[tuple[str, str], list[float]] = {(key, how): [] for key in KEYS for how in hows}
    print("| seed | value | owner alone | owner + copy, apart | ratio | owner + copy, merged | ratio |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        owners(work, owner)
        for seed in range(seeds):
            once = shares(work, 8, seed)
            twice = {"apart": shares(work, 9, seed), "merged": shares(work, 9, seed, merge=True)}
            for key in KEYS:
                alone, row = once[key][me], f"| {seed} | `{key}` | {once[key][me]:.1%} |"
                for how, run_ in twice.items():
                    both = run_[key][me] + run_[key][copy]
                    ratios[key, how].append(both / alone if alone > 0 else float("nan"))
                    row += f" {both:.1%} | {ratios[key, how][-1]:.2f} |"
                print(row, flush=True)
    print()
    for key in KEYS:
        said = ", ".join(f"{how} {np.nanmean(ratios[key, how]):.2f}" for how in hows)
        print(f"`{key}`: mean ratio {said}")
    print()
    return [
        Target("joining twice", f"a copy's owner paid at most 1.1x by the recommended value, {how}"
               + (" (the default)" if how == "apart" else " (--valuation-merge-redundant)"),
               f"{np.nanmean(ratios['fedsv_shrunk', how]):.2f}x over {seeds} seeds",
               bool(np.nanmean(ratios["fedsv_shrunk", how]) <= 1.1))
        for how in hows
    ]  # fmt: skip
