"""Who looks like a copy? How often a second identity with a copy of a member's data is named a
look-alike, against members with data of their own, with merging off (the default).

The embedded MNIST in 10 shards, IID and non-IID (two classes each), everyone selected (6 rounds) and
half selected (12 rounds), member 9 holding a copy of member 4's shard (`--corrupt 9=copy:4`, trained
with its own shuffling), exact values, the defaults otherwise (5 local epochs). The non-IID cells run
the seeds whose partition gives two honest members the same two classes (0, 1, 6, 8 of the first 16:
the members hardest to tell from a copy), and list those pairs' counts apart.

A round names the members whose updates are far more alike than independent data give
(fedsv/fl/redundancy.py); report.json's `lookalikes` counts, per pair, the rounds they were named alike
in of the rounds both were valued in. Per cell and seed this prints the copy's count, and for the 36
pairs of honest members: how many were named at all, and the most rounds of those both were valued in
that any of them was named alike in. The rule columns try a rule over the run: a pair named in more
than half of at least two rounds together.

    python benchmarks/bench_payouts.py --part lookalikes --seeds 3 [--epochs 1]
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.data.shards import cached_splits, load_shard
from fedsv.settings.choices import Partition
from fedsv.valuation import FederatedValuation
from payouts.targets import Target

COPY = ("p004", "p009")
CELLS = (("iid", 1.0, 6), ("iid", 0.5, 12), ("noniid", 1.0, 6), ("noniid", 0.5, 12))
SAME_CLASSES_SEEDS = (0, 1, 6, 8)
"""Seeds whose non-IID partition of the embedded MNIST gives two honest members the same two classes."""


def same_classes(seed: int) -> list[tuple[str, str]]:
    """Pairs of honest members holding the same classes (each at least a fifth of their shard)."""
    config = DemoConfig(participants=10, partition=Partition.NONIID, seed=seed)
    splits = cached_splits("embedded", "", seed, config.holdout())
    held = []
    for rank in range(9):  # not the copy
        shard, _ = load_shard(splits, rank, 10, "noniid", seed, "")
        labels, count = np.unique(shard.y, return_counts=True)
        held.append(frozenset(labels[count >= 0.2 * len(shard.y)].tolist()))
    return [(f"p{a:03d}", f"p{b:03d}") for a, b in itertools.combinations(range(9), 2) if held[a] == held[b]]


def counts(valuation: FederatedValuation) -> dict[tuple[str, str], tuple[int, int]]:
    """Per pair of members valued together in some round: (rounds named alike, rounds valued together)."""
    alike: dict[tuple[str, str], int] = {}
    together: dict[tuple[str, str], int] = {}
    for values in valuation.per_round():
        for pair in itertools.combinations(sorted(values.participants), 2):
            together[pair] = together.get(pair, 0) + 1
        for group in values.alike:
            for pair in itertools.combinations(sorted(group), 2):
                alike[pair] = alike.get(pair, 0) + 1
    return {pair: (alike.get(pair, 0), n) for pair, n in together.items()}


def persistent(alike: int, together: int) -> bool:
    """The rule tried: named in more than half of at least two rounds valued together."""
    return together >= 2 and alike > together / 2


def run(seeds: int, epochs: int) -> list[Target]:
    """Print the table; the targets: the copy named by the rule in every run, no honest pair named by it."""
    print(f"{epochs} local epochs\n")
    print(
        "| partition | selected | rounds | seed | copy named | honest pairs named | most for an honest pair "
        "| rule: copy | rule: honest pairs | honest pairs of the same classes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    runs, copies, honest_caught = 0, 0, 0
    for partition, fraction, rounds in CELLS:
        for seed in SAME_CLASSES_SEEDS if partition == "noniid" else range(seeds):
            settings: dict[str, Any] = {
                "participants": 10, "fraction": fraction, "rounds": rounds, "seed": seed,
                "partition": partition, "valuation": "exact", "epochs": epochs,
                "corrupt": f"{COPY[1][-1]}=copy:{COPY[0][-1]}",
            }  # fmt: skip
            pairs = counts(run_demo(DemoConfig(**settings)).valuation)
            copy = pairs.get(COPY, (0, 0))
            honest = {pair: n for pair, n in pairs.items() if COPY[1] not in pair}
            named = [n for n in honest.values() if n[0] > 0]
            most = max(named, key=lambda n: (n[0] / n[1], n[0]), default=(0, 0))
            caught = sum(persistent(*n) for n in honest.values())
            twins = same_classes(seed) if partition == "noniid" else []
            alike = [pairs.get(pair, (0, 0)) for pair in twins]
            if copy[1] >= 2:  # the rule needs two rounds together
                runs, copies = runs + 1, copies + persistent(*copy)
            honest_caught += caught
            print(
                f"| {partition} | {fraction:.0%} | {rounds} | {seed} | {copy[0]} of {copy[1]} "
                f"| {len(named)} of {len(honest)} | {most[0]} of {most[1]} "
                f"| {'yes' if persistent(*copy) else 'no'} | {caught} "
                f"| {', '.join(f'{a} of {n}' for a, n in alike) or '-'} |"
            )
    print(f"\n({time.perf_counter() - start:.0f} s)\n")
    part = f"look-alikes, {epochs} epoch{'s' if epochs > 1 else ''}"
    return [
        Target(part, "the copy named in more than half of its rounds with the original, every run with two",
               f"{copies} of {runs} runs", copies == runs),
        Target(part, "no honest pair named in more than half of its rounds",
               f"{honest_caught} pair-runs", honest_caught == 0),
    ]  # fmt: skip
