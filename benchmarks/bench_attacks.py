"""The attack matrix: accuracy lost to one dishonest participant, before (no guard) and under the defaults.

Usage: python benchmarks/bench_attacks.py [--seeds 0 1] [--fractions 0.5 0.34] [--rounds 8]

Trains 6 participants on the embedded MNIST sample (IID, 5 epochs, batch 10) in this process with the
same seeded draws, local training, guard and aggregation as `fedsv launch` (`fedsv.app.demo`), so the
models are those of real runs (tests/runtime/test_attack_matrix.py runs them through real processes).
Rank 3 attacks; each cell is its run's final test accuracy minus the honest run's (same seed and
settings). "before" is the previous defaults: FedAvg over declared counts, updates over 2x the round's
median norm clipped, no direction check; "defaults" is the guard (fedsv.fl.update_guard).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from fixtures import machine, print_table

from fedsv.app.demo import DemoConfig, demo_rounds
from fedsv.coordinator.config import UNGUARDED

ATTACKS = {
    "x1e6": "scale:1e6",
    "sign flip": "scale:-1",
    "-3x": "scale:-3",
    "10^7 declared": "count:10000000",
    "10^7 declared, reversed": "scale:-1+count:10000000",
}
BEFORE: dict[str, Any] = {**UNGUARDED, "update_norm_policy": "clip"}


def final_accuracy(settings: dict[str, Any]) -> float:
    accuracies = [accuracy for _, accuracy in demo_rounds(DemoConfig(**settings))]
    return accuracies[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.34])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}\n")
    rows = []
    for fraction in args.fractions:
        for seed in args.seeds:
            base = {
                "participants": 6, "fraction": fraction, "rounds": args.rounds, "seed": seed,
                "valuation": "none", "validation_size": 300,
            }  # fmt: skip
            for label, guard in (("before", BEFORE), ("defaults", {})):
                honest = final_accuracy({**base, **guard})
                lost = [
                    final_accuracy({**base, **guard, "corrupt": f"3={spec}"}) - honest
                    for spec in ATTACKS.values()
                ]
                selected = max(1, round(fraction * 6))
                rows.append([str(selected), str(seed), label, f"{honest:.3f}", *(f"{d:+.3f}" for d in lost)])
                print(" ".join(rows[-1]), flush=True)
    print()
    print_table(["selected", "seed", "settings", "honest acc.", *ATTACKS], rows)


if __name__ == "__main__":
    main()
