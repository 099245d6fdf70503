"""Do the stated errors cover a rerun, and do the amounts follow the data? Five federations, rerun.

Each federation of benchmarks/federations.py (fixed member files) is rerun over seeds: every rerun
another seed (selections, SGD orders, the initial model) and a fresh validation set (a seeded bootstrap
of the validation file), exact values every round, trained and valued in this process as `fedsv launch`
trains and values them (fedsv.app.demo.run_demo: the same selections, models and values). Per
federation and value it prints:

- sd/stated: the SD of a member's total across reruns over its mean stated standard error (median
  over members; 1 means the stated errors are the right size), and the same member by member: its
  10th and 90th percentiles over the members, and the lowest share of reruns in which a member's 95%
  interval holds its mean total over the reruns (its expected total; 95% where its errors are right).
  A median of 1 can hide members whose errors are half their size: those members' intervals cover
  less, and the member-by-member figures show it;
- twins: the mean |difference| between twins' totals over the mean absolute total, the same in payout
  shares over the mean share (what they are paid: two twins worth less than nothing are both paid 0),
  and how often twins' 95% intervals overlap (pairs x reruns);
- share RMSE: the RMSE of a run's payout shares (negative values paid nothing) against each member's
  expected share, and its ratio to that of `fedsv_completed`. The expected share is the same for every
  value: the member's mean share over the reruns by `fedsv_completed`, the expectation of FedSV over
  the selection (what the paper's value pays it on average). Against each value's own mean, a value
  that paid everyone alike would score 0 whatever the members' data.
- a reference for the share target: the share RMSE (vs completed) of the best single pull of the
  completed totals, m + lambda (c_i - m), with one lambda for every member and run chosen knowing the
  expected shares (an oracle no run has), towards the members' mean and towards the mean of each run's
  verdict group. Where even that stays over 0.9x, a pull of that form cannot meet the target there; a
  pull whose factor differs by member (by its noise, as the recommended value's) can do a little
  better than one lambda, so it is a reference, not a bound.

Reruns measure these figures with noise of their own (an SD from 16 reruns is off by about a fifth, and
the twins' share ratio read 0.93 on seeds 0-15 and 1.14 on seeds 16-31): each figure comes with a 90%
interval from resampling the reruns (BOOTSTRAP times, the expected shares taken again from each
resample), and the default is 32 reruns per federation (about 20 minutes of training on 2 cores, once:
`--out` keeps them).

    python benchmarks/bench_calibration.py --seeds 32 --rounds 10 --out runs/calibration
    python benchmarks/bench_calibration.py --seeds 32 --rounds 10 --out runs/calibration --draw independent

Selection is balanced (the default) unless `--draw independent`, the paper's draw.
"""

from __future__ import annotations

import argparse
import pickle
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from federations import BUILDERS, Federation

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.valuation import FederatedValuation
from fedsv.valuation.accounting.bagging import verdict_groups
from fedsv.valuation.accounting.verdict import Z95
from fedsv.valuation.errors.rerun_check import (
    Members,
    best_pull,
    sd_stated,
    share_gap,
    share_rmse,
    shares,
)

KEYS = ("fedsv_shrunk", "fedsv_completed", "fedsv", "fedsv_normalized", "loo")
BOOTSTRAP = 1000
"""Resamples of the reruns behind each figure's interval."""
LEVEL = 0.90
"""The intervals' coverage."""


def rerun(
    federation: Federation, work: Path, seed: int, rounds: int, draw: str = "balanced"
) -> FederatedValuation:
    """One rerun's accounting, its members selected by `draw`'s rule; the round values of one left in
    `work` by an earlier call are read back into a fresh accounting (so a change to how totals and
    errors are taken is measured without training again)."""
    rule = "" if draw == "independent" else f"-{draw}"  # kept independent reruns predate the setting
    kept = work / f"{federation.name}{rule}-run{seed}.pkl"
    if not kept.exists():
        settings = {**federation.rerun(work, seed), "rounds": rounds, "valuation": "exact", "draw": draw}
        done = run_demo(DemoConfig(**settings)).valuation
        with kept.open("wb") as f:
            pickle.dump((done.world, done.initial_scores, done.per_round()), f)
    with kept.open("rb") as f:
        world, initial, per_round = pickle.load(f)
    valuation = FederatedValuation(world, initial, balanced=draw == "balanced")
    for values in per_round:
        vars(values).setdefault("merged", [])  # kept before RoundValues had it: nothing was merged
        vars(values).setdefault("public", [])  # kept before RoundValues had it: nothing was public
        valuation.add_round(values)
    return valuation


@dataclass(frozen=True)
class Figures:
    """One value's figures over a federation's reruns (each an array over the reruns' resamples, the
    first entry the reruns as run): sd/stated (and member by member, on the reruns as run), the share
    RMSE and its ratio to `fedsv_completed`'s, and with twins their gap (in values, and in payout
    shares: what they are paid) and how often their intervals overlap (None without twins)."""

    sd_stated: np.ndarray
    members: Members
    rmse: np.ndarray
    ratio: np.ndarray
    twin_gap: np.ndarray | None
    overlap: np.ndarray | None
    share_gap: np.ndarray | None


def measures(federation: Federation, runs: list[FederatedValuation]) -> dict[str, Figures]:
    """Per value: sd/stated, twins' gap and overlap, and the share RMSE against the expected shares,
    on the reruns and on BOOTSTRAP resamples of them."""
    ids = runs[0].participants()
    col = {p: k for k, p in enumerate(ids)}
    found_values = {
        key: (
            np.array([[run.totals()[key][p] for p in ids] for run in runs]),
            np.array([[run.errors()[key][p] for p in ids] for run in runs], dtype=float),
        )
        for key in KEYS
    }
    rng = np.random.default_rng(0)
    samples = [np.arange(len(runs))] + [rng.integers(0, len(runs), len(runs)) for _ in range(BOOTSTRAP)]
    pairs = [(col[a], col[b]) for a, b in federation.twins]
    found: dict[str, dict[str, list[float]]] = {key: {} for key in KEYS}
    for k, rows in enumerate(samples):
        expected = shares(found_values["fedsv_completed"][0][rows]).mean(axis=0)
        base = share_rmse(found_values["fedsv_completed"][0][rows], expected)
        for key, (all_totals, all_errors) in found_values.items():
            totals, errors = all_totals[rows], all_errors[rows]
            row = found[key]
            row.setdefault("sd_stated", []).append(sd_stated(totals, errors, k > 0))
            rmse = share_rmse(totals, expected)
            row.setdefault("rmse", []).append(rmse)
            row.setdefault("ratio", []).append(rmse / base)
            if pairs:
                gaps = np.abs(totals[:, [a for a, _ in pairs]] - totals[:, [b for _, b in pairs]])
                bound = Z95 * (errors[:, [a for a, _ in pairs]] + errors[:, [b for _, b in pairs]])
                row.setdefault("twin_gap", []).append(float(gaps.mean() / np.abs(totals).mean()))
                row.setdefault("overlap", []).append(float((gaps <= bound).mean()))
                row.setdefault("share_gap", []).append(share_gap(totals, pairs))
    return {
        key: Figures(
            np.array(row["sd_stated"]),
            Members.of(ids, *found_values[key]),
            np.array(row["rmse"]),
            np.array(row["ratio"]),
            np.array(row["twin_gap"]) if pairs else None,
            np.array(row["overlap"]) if pairs else None,
            np.array(row["share_gap"]) if pairs else None,
        )
        for key, row in found.items()
    }


@dataclass(frozen=True)
class Bound:
    """The best single pull of the completed totals knowing the expected shares (a reference): its
    lambda and its share RMSE over completed's, towards the members' mean and within each run's verdict
    groups."""

    grand: tuple[float, float]
    within: tuple[float, float]


def bound(runs: list[FederatedValuation]) -> Bound:
    """The share target's oracle reference (see the module's docstring) on the reruns as run."""
    ids = runs[0].participants()
    completed = np.array([[run.totals()["fedsv_completed"][p] for p in ids] for run in runs])
    expected = shares(completed).mean(axis=0)
    means = np.zeros_like(completed)  # each member's verdict group's mean, in its run
    for r, run in enumerate(runs):
        groups = verdict_groups(ids, completed[r], run.uncertainty().between("fedsv_completed"))
        for group in groups or [list(range(len(ids)))]:
            means[r, list(group)] = completed[r, list(group)].mean()

    centre = np.broadcast_to(completed.mean(axis=1, keepdims=True), completed.shape)
    return Bound(best_pull(completed, centre, expected), best_pull(completed, means, expected))


def _with_interval(draws: np.ndarray) -> str:
    """The figure on the reruns as run, with its LEVEL interval over the resamples."""
    low, high = np.nanquantile(draws[1:], [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return f"{draws[0]:.2f} ({low:.2f}-{high:.2f})"


def table(federation: Federation, found: dict[str, Figures], reruns: int) -> str:
    lines = [
        f"**{federation.name}** ({reruns} reruns; corrupted: {', '.join(federation.corrupted) or 'none'};"
        f" {LEVEL:.0%} intervals over {BOOTSTRAP} resamples of the reruns)",
        "",
        "| value | sd / stated | members' sd / stated, 10th-90th percentile | lowest member's 95% coverage "
        "| twin gap / mean abs total | in shares / mean share | twins' 95% intervals overlap | share RMSE "
        "| vs completed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, row in found.items():
        twin = ("-", "-", "-")
        if row.twin_gap is not None and row.overlap is not None and row.share_gap is not None:
            twin = (_with_interval(row.twin_gap), _with_interval(row.share_gap), f"{row.overlap[0]:.0%}")
        spread = f"{row.members.low:.2f}-{row.members.high:.2f}"
        coverage = f"{row.members.coverage:.0%} ({row.members.worst})"
        lines.append(
            f"| `{key}` | {_with_interval(row.sd_stated)} | {spread} | {coverage} | {' | '.join(twin)} | "
            f"{row.rmse[0]:.4f} | {_with_interval(row.ratio)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--federations", default=",".join(BUILDERS), help="comma-separated names")
    parser.add_argument("--out", default="", help="keep the reruns here (and reuse those already there)")
    parser.add_argument("--draw", default="balanced", choices=["balanced", "independent"], help="selection")
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; "
        f"draw {args.draw}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.federations.split(","):
            federation = BUILDERS[name](work)
            started = time.perf_counter()
            runs = [rerun(federation, work, seed, args.rounds, args.draw) for seed in range(args.seeds)]
            found = measures(federation, runs)
            ref = bound(runs)
            seconds = time.perf_counter() - started
            print(f"\n{table(federation, found, len(runs))}", flush=True)
            print(
                "\nreference, the best single pull (one lambda, chosen knowing the expected shares):"
                f" towards the members' mean {ref.grand[1]:.2f}x completed (lambda {ref.grand[0]:.2f}),"
                f" within each run's verdict groups {ref.within[1]:.2f}x (lambda {ref.within[0]:.2f})"
                f"\n({seconds:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
