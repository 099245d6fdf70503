"""How far the shrunk value's pull lands from the truth, where the truth is known.

Two tables of the mean squared error per member, in units of the noise's variance s^2 (1.00: the
completed totals themselves, no pull), of fedsv.valuation.accounting.shrinkage's pull (James and
Stein's degrees of freedom, shrinkage.STEIN):

- the pull alone: one group of k members given, their true totals spread by tau around a common level;
- the pull within the verdict's groups, found from the totals as a run finds them
  (bagging.verdict_groups), k members whose true totals are evenly spaced `gap` s apart (0: equals):
  the recommended value, averaged over the groups of BAGS reruns (each draw a fresh one of the noise,
  from where bagging.AROUND starts them: bagging.bagged; a fifth of the draws, as it costs BAGS times
  as much), and within the run's own groups alone; beside them, James and Stein's pull
  towards every member (one group of all, whatever the verdict), which never does worse than no pull
  on average for k >= 4 (Stein's dominance).

    python benchmarks/bench_pull.py --draws 20000
"""

from __future__ import annotations

import argparse
import platform

import numpy as np

from fedsv.valuation.accounting import shrinkage
from fedsv.valuation.accounting.bagging import BAGS, bagged, verdict_groups

SIZES = (3, 4, 5, 8, 16)
SPREADS = (0.0, 0.5, 1.0, 2.0, 4.0)
GAPS = (0.0, 0.5, 1.0, 2.0, 3.0)


def risk(k: int, spread: float, draws: int, seed: int) -> float:
    """Mean squared error per member over `draws` groups, in units of the noise's variance."""
    rng = np.random.default_rng(seed)
    errors = np.ones(k)
    total = 0.0
    for _ in range(draws):
        truth = rng.normal(0.0, spread, k)
        totals = truth + rng.normal(0.0, 1.0, k)
        pulled = shrinkage.Shrinkage.fit(totals, errors, [list(range(k))]).apply(totals)
        total += float(np.mean(np.square(pulled - truth)))
    return total / draws


def grouped_risk(k: int, gap: float, everyone: bool, draws: int, seed: int, bag: bool = False) -> float:
    """The same, members evenly spaced `gap` apart, pulled within the verdict's groups (`bag`: averaged
    over reruns' groups; or, `everyone`, towards all members as one group)."""
    rng = np.random.default_rng(seed)
    ids, errors, truth = [f"p{i:03d}" for i in range(k)], np.ones(k), gap * np.arange(k, dtype=np.float64)
    total = 0.0
    for _ in range(draws):
        totals = truth + rng.normal(0.0, 1.0, k)
        if bag:
            pulled = bagged(ids, totals, errors, None, rng.normal(0.0, 1.0, (BAGS, k))).apply(totals)
            total += float(np.mean(np.square(pulled - truth)))
            continue
        groups = [list(range(k))] if everyone else verdict_groups(ids, totals, errors)
        pulled = shrinkage.Shrinkage.fit(totals, errors, groups).apply(totals)
        total += float(np.mean(np.square(pulled - truth)))
    return total / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=20000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}, {args.draws} draws a cell\n")
    print("| k | tau / s | the pull (James-Stein) | no pull (exact) |")
    print("|---|---|---|---|")
    for k in SIZES:
        for spread in SPREADS:
            risked = risk(k, spread, args.draws, 1000 * k + int(10 * spread))
            print(f"| {k} | {spread:g} | {risked:.3f} | 1.000 |", flush=True)
    print("\n| k | gap / s | averaged over reruns' groups (recommended) | within the run's groups", end=" ")
    print("| towards everyone |")
    print("|---|---|---|---|---|")
    draws = max(args.draws // 10, 1)  # the verdict's test per draw costs more than the pull
    for k in SIZES[1:]:
        for gap in GAPS:
            seed = 1000 * k + int(10 * gap)
            found = [
                grouped_risk(k, gap, False, max(draws // 5, 1), seed, bag=True),
                grouped_risk(k, gap, False, draws, seed),
                grouped_risk(k, gap, True, draws, seed),
            ]
            print(f"| {k} | {gap:g} | " + " | ".join(f"{x:.3f}" for x in found) + " |", flush=True)


if __name__ == "__main__":
    main()
