"""The attack matrix: accuracy lost to dishonest participants, and what free riders earn, under the defaults.

Usage: python benchmarks/bench_attacks.py [--part single riders colluders honest aggregators calibration]
       [--seeds 0 1 2] [--rounds 8]

Trains federations on the embedded MNIST sample (5 epochs, batch 10) in this process with the same
seeded draws, local training, guard and aggregation as `fedsv launch` (`fedsv.app.demo`), so the
models are those of real runs (tests/runtime/test_attack_matrix.py runs cells through real processes).
Each accuracy cell is its run's final test accuracy minus the honest run's (same seed and settings).

- single: one attacker (rank 3) among 6, 3 or 2 selected; "before" is the previous defaults (FedAvg
  over declared counts, updates over 2x the round's median norm clipped, no direction check),
  "defaults" the guard (fedsv.fl.update_guard).
- riders: one free rider (rank 3) among 6, 3 selected, IID and two-class non-IID, valued exactly:
  accuracy lost, its rounds refused of selected, its FedSV and recommended value (fedsv_shrunk) and its
  share of a payout with negative values paid nothing.
- colluders: 2 of 6 (3 selected) and 4 of 20 (10 selected), ranks 1.., IID and two-class non-IID,
  valued exactly: sign flip (each sends minus its update), "a little is enough" and inner-product
  manipulation (ByzFL's attacks and factors, fedsv.data.collusion: the group trains every colluder's
  data each round and sends one vector). Each attack's final accuracy is compared with the run whose
  colluders withhold their data (send nothing: "the run without them"; in a two-class non-IID
  federation their classes are missing whatever the guard does) and with the honest run; the
  colluders' rounds turned away of selected, the honest members' turned away of selected, and the
  colluders' largest payout share (recommended value, negative values paid nothing, a member turned away
  for sending another's very update paid nothing, as `fedsv payout` pays) over the lowest
  honest member's.
- honest: no attacker; updates the guard refused and members quarantined (both must be 0) and the final
  accuracy.
- aggregators: the colluders' federations (non-IID) under the guard with FedAvg (the defaults) and
  under fedsv's robust rules without the guard (median, trimmed mean cutting a third at each end,
  Krum and Multi-Krum with f = 0 of 3 selected and 3 of 10): each attack's final accuracy less that of
  the defaults' run whose colluders send nothing.
- calibration: the calibration benchmark's federations (benchmarks/federations.py: honest members and
  members with damaged data), valued, with the trusted step and without it (`update_trusted_step`):
  final accuracy, updates it turned away (honest members', damaged members'), the honest members'
  mean absolute change of payout share and the damaged members' total share.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import torch
from fixtures import machine, print_table

from fedsv.app.demo import DemoConfig, TrainedRound, demo_rounds, run_demo
from fedsv.app.payout import shares
from fedsv.settings.run import UNGUARDED

SINGLE = {
    "x1e6": "scale:1e6",
    "sign flip": "scale:-1",
    "-3x": "scale:-3",
    "10^7 declared": "count:10000000",
    "10^7 declared, reversed": "scale:-1+count:10000000",
}
RIDERS = {
    "zero": "scale:0",
    "zero, 10^7 declared": "scale:0+count:10000000",
    "noise 0.01": "noise:0.01",
    "noise 0.01, 10^7 declared": "noise:0.01+count:10000000",
    "replay": "replay",
    "replay, 10^7 declared": "replay+count:10000000",
}
HONEST = [(6, 0.5), (20, 0.5), (50, 0.2)]
BEFORE: dict[str, Any] = {**UNGUARDED, "update_norm_policy": "clip"}


def settings_of(
    members: int, fraction: float, rounds: int, seed: int, partition: str, draw: str = "balanced"
) -> dict[str, Any]:
    """A federation's settings for these runs (values off: accuracy cells)."""
    return {
        "participants": members, "fraction": fraction, "rounds": rounds, "seed": seed,
        "partition": partition, "valuation": "none", "validation_size": 300, "draw": draw,
    }  # fmt: skip


def final_accuracy(settings: dict[str, Any]) -> tuple[float, int]:
    """The run's final test accuracy and how many updates the guard refused."""
    run = guarded_run(settings)
    return run.accuracy, run.refused


@dataclass(frozen=True)
class GuardedRun:
    """A run's final test accuracy, the updates the guard refused and the members it quarantined."""

    accuracy: float
    refused: int
    quarantined: set[str]


def guarded_run(settings: dict[str, Any]) -> GuardedRun:
    config = DemoConfig(**settings)
    accuracies, refused, quarantined = [], 0, set()
    for trained, accuracy in demo_rounds(config):
        accuracies.append(accuracy)
        refused += config.selected_per_round - len(trained.updates)
        quarantined.update(trained.quarantined)
    return GuardedRun(accuracies[-1], refused, quarantined)


def single(seeds: list[int], rounds: int, draw: str) -> None:
    rows = []
    for fraction in (0.5, 0.34):
        for seed in seeds:
            base = {
                "participants": 6, "fraction": fraction, "rounds": rounds, "seed": seed,
                "valuation": "none", "validation_size": 300, "draw": draw,
            }  # fmt: skip
            for label, guard in (("before", BEFORE), ("defaults", {})):
                honest, _ = final_accuracy({**base, **guard})
                lost = [
                    final_accuracy({**base, **guard, "corrupt": f"3={spec}"})[0] - honest
                    for spec in SINGLE.values()
                ]
                selected = max(1, round(fraction * 6))
                rows.append([str(selected), str(seed), label, f"{honest:.3f}", *(f"{d:+.3f}" for d in lost)])
                print(" ".join(rows[-1]), flush=True)
    print_table(["selected", "seed", "settings", "honest acc.", *SINGLE], rows)


def riders(seeds: list[int], rounds: int, draw: str) -> None:
    rows = []
    for partition in ("iid", "noniid"):
        for seed in seeds:
            base = {**settings_of(6, 0.5, rounds, seed, partition, draw), "valuation": "exact"}
            honest = run_demo(DemoConfig(**base)).accuracies[-1]
            for name, spec in RIDERS.items():
                result = run_demo(DemoConfig(**base, corrupt=f"3={spec}"))
                totals = result.valuation.totals()
                ids = sorted(totals["fedsv"])
                shrunk = [totals["fedsv_shrunk"][p] or 0.0 for p in ids]
                paid = shares(shrunk, [None] * len(ids), 1.0, "zero")[ids.index("p003")][0]
                records = result.valuation.per_round()
                picked = sum(1 for r in records if "p003" in (r.selected or r.participants))
                refused = picked - sum(1 for r in records if "p003" in r.participants)
                fedsv, rec = totals["fedsv"]["p003"] or 0.0, totals["fedsv_shrunk"]["p003"] or 0.0
                rank = 1 + sum(v > rec for v in shrunk)
                rows.append([
                    partition, str(seed), name, f"{result.accuracies[-1] - honest:+.3f}",
                    f"{refused}/{picked}", f"{fedsv:+.4f}", f"{rec:+.4f}", f"{rank} of 6", f"{paid:.1%}",
                ])  # fmt: skip
                print(" ".join(rows[-1]), flush=True)
    header = [
        "partition",
        "seed",
        "free rider",
        "acc. lost",
        "refused",
        "FedSV",
        "recommended",
        "rank",
        "paid",
    ]
    print_table(header, rows)


COLLUDING = {"sign flip": "scale:-1", "ALIE": "alie", "IPM": "ipm"}
COLLUDING_FEDERATIONS = [(6, 0.5, 2), (20, 0.5, 4)]  # members, fraction, colluders


@dataclass(frozen=True)
class ColludedRun:
    """A valued run's final accuracy, rounds turned away of selected (colluders, honest members), and
    the colluders' largest share over the lowest honest member's (recommended value)."""

    accuracy: float
    colluders_refused: tuple[int, int]
    honest_refused: tuple[int, int]
    share_ratio: float


def colluded_run(settings: dict[str, Any], colluders: set[str]) -> ColludedRun:
    forfeited: set[str] = set()  # sent another member's very update: paid nothing (fedsv.app.payout.FORFEIT)
    result = run_demo(DemoConfig(**settings), on_trained=lambda trained: forfeited.update(trained.identical))
    totals = result.valuation.totals()
    ids = sorted(p for p in totals["fedsv"] if p not in forfeited)
    shrunk = [totals["fedsv_shrunk"][p] or 0.0 for p in ids]
    paid = dict.fromkeys(forfeited, 0.0)
    paid |= {
        p: share[0] for p, share in zip(ids, shares(shrunk, [None] * len(ids), 1.0, "zero"), strict=True)
    }
    lowest = min(paid[p] for p in ids if p not in colluders)
    worst = max((paid[p] for p in colluders), default=0.0)
    rounds = result.valuation.per_round()

    def refused(bad: bool) -> tuple[int, int]:
        chosen = [(p, r) for r in rounds for p in r.selected or r.participants if (p in colluders) == bad]
        return sum(p not in r.participants for p, r in chosen), len(chosen)

    ratio = worst / lowest if lowest > 0 else (0.0 if worst == 0 else math.inf)
    return ColludedRun(result.accuracies[-1], refused(True), refused(False), ratio)


def colluders(seeds: list[int], rounds: int, draw: str) -> None:
    rows = []
    for members, fraction, count in COLLUDING_FEDERATIONS:
        group = {f"p{r:03d}" for r in range(1, count + 1)}
        for partition in ("iid", "noniid"):
            for seed in seeds:
                base = {**settings_of(members, fraction, rounds, seed, partition, draw), "valuation": "exact"}
                honest = colluded_run(base, set())
                ranks = f"1-{count}"
                withheld, _ = final_accuracy({**base, "valuation": "none", "corrupt": f"{ranks}=scale:0"})
                cells = []
                for spec in COLLUDING.values():
                    run = colluded_run({**base, "corrupt": f"{ranks}={spec}"}, group)
                    cells += [
                        f"{run.accuracy - withheld:+.3f}",
                        f"{run.accuracy - honest.accuracy:+.3f}",
                        "{}/{}".format(*run.colluders_refused),
                        "{}/{}".format(*run.honest_refused),
                        f"{run.share_ratio:.2f}",
                    ]
                selected = max(1, round(fraction * members))
                rows.append([
                    f"{count} of {members}", str(selected), partition, str(seed), f"{honest.accuracy:.3f}",
                    "{}/{}".format(*honest.honest_refused), f"{withheld - honest.accuracy:+.3f}", *cells,
                ])  # fmt: skip
                print(" ".join(rows[-1]), flush=True)
    parts = ("vs without", "vs honest", "refused", "honest refused", "share / lowest")
    attacks = [f"{name}: {part}" for name in COLLUDING for part in parts]
    print_table(
        ["colluders", "selected", "partition", "seed", "honest acc.", "honest refused", "without", *attacks],
        rows,
    )


def honest_runs(seeds: list[int], rounds: int, draw: str) -> None:
    rows = []
    for members, fraction in HONEST:
        for partition in ("iid", "noniid"):
            for seed in seeds:
                run = guarded_run(settings_of(members, fraction, rounds, seed, partition, draw))
                selected = max(1, round(fraction * members))
                rows.append([
                    str(members), str(selected), partition, str(seed), f"{run.accuracy:.3f}",
                    str(run.refused), str(len(run.quarantined)),
                ])  # fmt: skip
                print(" ".join(rows[-1]), flush=True)
    header = ["members", "selected", "partition", "seed", "final acc.", "updates refused", "quarantined"]
    print_table(header, rows)


ROBUST: dict[str, dict[str, Any]] = {
    "median": {"aggregation": "median"},
    "trimmed mean": {"aggregation": "trimmed_mean", "aggregation_trim": 0.34},
    "Krum": {"aggregation": "krum"},
    "Multi-Krum": {"aggregation": "multi_krum"},
}
"""fedsv's robust rules (Flower's definitions), each run without the guard (UNGUARDED)."""


def aggregators(seeds: list[int], rounds: int, draw: str) -> None:
    rows = []
    for members, fraction, count in COLLUDING_FEDERATIONS:
        selected = max(1, round(fraction * members))
        byzantine = 0 if selected < 5 else count - 1  # Krum needs selected >= 2f + 3
        for seed in seeds:
            base = settings_of(members, fraction, rounds, seed, "noniid", draw)
            ranks = f"1-{count}"
            withheld, _ = final_accuracy({**base, "corrupt": f"{ranks}=scale:0"})
            rules: dict[str, dict[str, Any]] = {"guard + FedAvg": {}} | {
                name: {**UNGUARDED, **rule, "aggregation_byzantine": byzantine}
                for name, rule in ROBUST.items()
            }
            cells = []
            for attack in COLLUDING.values():
                for rule in rules.values():
                    accuracy, _ = final_accuracy({**base, **rule, "corrupt": f"{ranks}={attack}"})
                    cells.append(f"{accuracy - withheld:+.3f}")
            rows.append([f"{count} of {members}", str(selected), str(seed), f"{withheld:.3f}", *cells])
            print(" ".join(rows[-1]), flush=True)
    names = ["guard + FedAvg", *ROBUST]
    print_table(
        ["colluders", "selected", "seed", "without", *(f"{a}: {r}" for a in COLLUDING for r in names)], rows
    )


def _shares(result: Any) -> dict[str, float]:
    totals = result.valuation.totals()
    ids = sorted(totals["fedsv"])
    shrunk = [totals["fedsv_shrunk"][p] or 0.0 for p in ids]
    return {p: share[0] for p, share in zip(ids, shares(shrunk, [None] * len(ids), 1.0, "zero"), strict=True)}


def calibration(seeds: list[int], rounds: int, draw: str) -> None:
    import tempfile
    from pathlib import Path

    from federations import BUILDERS

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, build in BUILDERS.items():
            federation = build(work)
            damaged = set(federation.corrupted)
            for seed in seeds:
                settings = {**federation.rerun(work, seed), "rounds": rounds, "draw": draw}
                trained: list[TrainedRound] = []
                on = run_demo(DemoConfig(**settings), on_trained=trained.append)
                against = [p for t in trained for p in t.refused_against]
                off = run_demo(DemoConfig(**{**settings, "update_trusted_step": False}))
                paid_on, paid_off = _shares(on), _shares(off)
                honest = [p for p in paid_on if p not in damaged]
                change = sum(abs(paid_on[p] - paid_off[p]) for p in honest) / len(honest)
                rows.append([
                    name, str(seed), f"{on.accuracies[-1]:.3f}", f"{off.accuracies[-1]:.3f}",
                    str(sum(p not in damaged for p in against)), str(sum(p in damaged for p in against)),
                    f"{100 * change:.2f}", f"{100 * sum(paid_on[p] for p in damaged):.1f}",
                    f"{100 * sum(paid_off[p] for p in damaged):.1f}",
                ])  # fmt: skip
                print(" ".join(rows[-1]), flush=True)
    header = [
        "federation", "seed", "acc. (trusted step)", "acc. (without)", "honest turned away by it",
        "damaged turned away by it", "honest share change (points)", "damaged share % (with)",
        "damaged share % (without)",
    ]  # fmt: skip
    print_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["single", "riders", "colluders", "honest"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--draw", choices=["balanced", "independent"], default="balanced", help="selection rule"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}\n")
    parts = {"single": single, "riders": riders, "colluders": colluders, "honest": honest_runs}
    parts["calibration"] = calibration
    parts["aggregators"] = aggregators
    for part in args.part:
        print(f"\n## {part}\n")
        parts[part](args.seeds, args.rounds, args.draw)


if __name__ == "__main__":
    main()
