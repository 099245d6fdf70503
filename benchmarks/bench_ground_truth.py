"""fedsv's values against the canonical Shapley value, on federations small enough to retrain every coalition.

The canonical value is the definition fedsv approximates: retrain the model on every coalition of
members, with the run's own training (its rounds, local epochs, guard and aggregation; every member of
the coalition in every round), score it on the validation set, and average each member's marginal gains
(`fedsv.app.canonical`; the utilities averaged over `--canonical-seeds` training seeds, each seed
sharing its initial model and its members' training seeds across coalitions). Four federations of six
digits members (`federations.GROUND_TRUTH`): IID; two classes each with two members sharing theirs; IID
with a noisy member; IID with a 30-image member.

Each federation then runs `--seeds` times with every member in every round and with half of them per
round (the default fraction), valued exactly, trained in this process as `fedsv launch` trains. For
each of fedsv's values it prints, over the seeds: the mean Spearman correlation of the payout shares
with the canonical shares (equal shares are ties; a run paying everyone alike counts 0), the mean
absolute share error in points, and how many members worth at least 0.5/N canonically were paid under
0.5/N. Shares pay negative values nothing. It also prints the verdict's false negatives: pairs of
members whose canonical shares differ by more than 1/N that the verdict puts in one group.

    python benchmarks/bench_ground_truth.py                       # the docs' table (8 seeds)
    python benchmarks/bench_ground_truth.py --federations iid --seeds 2 --canonical-seeds 1
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
from federations import GROUND_TRUTH, ROOT
from fixtures import machine, print_table
from scipy.stats import spearmanr

from fedsv.app.canonical import RETRAINING, federation_canonical
from fedsv.app.demo import DemoConfig, TrainedRound, run_demo
from fedsv.fl.ranks import participant_id
from fedsv.valuation.accounting.verdict import owners_verdict
from fedsv.valuation.errors.rerun_check import shares
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.round.reconstructed import ReconstructedRun

VALUES = ("fedsv", "fedsv_completed", "fedsv_shrunk", "loo", "reconstructed")
"""fedsv's values, and the reconstructed run's Shapley value (every coalition's model rebuilt from the
run's aggregated updates: fedsv.valuation.round.reconstructed), a candidate not in the product yet."""
VERDICT = "fedsv_completed"  # the values the verdict tests (as `fedsv report` does)
ROUNDS = 8


@dataclass(frozen=True)
class Canonical:
    """A federation's canonical shares and their standard errors (from the seeds' spread)."""

    shares: list[float]
    values: list[float]
    errors: list[float]
    seconds: float


@dataclass(frozen=True)
class Scores:
    """One run's value against the canonical shares."""

    spearman: float
    error: float  # mean absolute share error, in points
    underpaid: int  # members worth >= 0.5/N canonically, paid < 0.5/N


def canonical(name: str, settings: dict, seeds: int, cache: Path) -> Canonical:
    """The federation's canonical value, from `cache` when it was computed with these settings."""
    key = {"settings": settings, "seeds": seeds, "unguarded": {k: str(v) for k, v in RETRAINING.items()}}
    path = cache / f"{name}-canonical.json"
    if path.exists():
        stored = json.loads(path.read_text())
        if stored["key"] == key:
            return Canonical(**stored["canonical"])
    started = time.time()
    found = federation_canonical(DemoConfig(**settings), list(range(seeds)))
    result = Canonical(
        found.shares().tolist(), found.values.tolist(), found.errors.tolist(), time.time() - started
    )
    path.write_text(json.dumps({"key": key, "canonical": result.__dict__}))
    return result


def score(shares: np.ndarray, truth: np.ndarray) -> Scores:
    n = len(truth)
    rho = 0.0 if np.ptp(shares) == 0 else float(spearmanr(shares, truth).statistic)
    underpaid = int(np.sum((truth >= 0.5 / n) & (shares < 0.5 / n)))
    return Scores(rho, 100 * float(np.mean(np.abs(shares - truth))), underpaid)


@dataclass(frozen=True)
class Run:
    """One run's scores per value, the verdict's false negatives out of the pairs it should part, and
    the updates the guard turned away out of those selected."""

    scores: dict[str, Scores]
    pooled: int
    pairs: int
    refused: int
    selected: int


def reconstructed(rounds: list[TrainedRound], ids: list[str], config: DemoConfig) -> dict[str, float]:
    """The reconstructed run's exact Shapley values (every coalition rebuilt from the aggregated updates)."""
    first = rounds[0]
    game = ReconstructedRun(
        first.model,
        first.params,
        [r.updates for r in rounds],
        ids,
        first.validation,
        config.load_task().metric,
    )
    return dict(zip(ids, ExactShapley().run(game).values.tolist(), strict=True))


def run(settings: dict, fraction: float, seed: int, truth: np.ndarray) -> Run:
    """One run of the federation, valued exactly, against the canonical shares."""
    config = DemoConfig(**{**settings, "fraction": fraction, "seed": seed, "valuation": "exact"})
    trained: list[TrainedRound] = []
    valuation = run_demo(config, on_trained=trained.append).valuation
    ids = [participant_id(r) for r in range(len(truth))]
    totals = {**valuation.totals(), "reconstructed": reconstructed(trained, ids, config)}
    scores = {
        name: score(shares(np.array([[totals[name].get(p, 0.0) for p in ids]]))[0], truth) for name in VALUES
    }
    errors = valuation.between_errors()[VERDICT]
    found = owners_verdict(totals[VERDICT], {p: errors.get(p) for p in totals[VERDICT]}, [])
    group = {p: g for g, members in enumerate(found.groups) for p in members}
    apart = [(a, b) for a, b in combinations(range(len(ids)), 2) if abs(truth[a] - truth[b]) > 1 / len(ids)]
    pooled = sum(group.get(ids[a], -1) == group.get(ids[b], -2) for a, b in apart)
    rounds = valuation.per_round()
    selected = sum(len(rv.selected or rv.participants) for rv in rounds)
    refused = selected - sum(len(rv.participants) for rv in rounds)
    return Run(scores, pooled, len(apart), refused, selected)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--federations", default=",".join(GROUND_TRUTH))
    parser.add_argument("--seeds", type=int, default=8, help="fedsv runs per federation and fraction")
    parser.add_argument(
        "--canonical-seeds", type=int, default=3, help="training seeds the canonical value averages"
    )
    parser.add_argument("--fractions", default="1.0,0.5")
    parser.add_argument("--work", type=Path, default=ROOT / "runs/ground-truth")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    truth_rows, rows = [], []
    for name in args.federations.split(","):
        federation = GROUND_TRUTH[name](args.work)
        settings = {**federation.settings, "rounds": ROUNDS, "validation_data": federation.validation}
        found = canonical(
            name, {**settings, "fraction": 1.0, "valuation": "none"}, args.canonical_seeds, args.work
        )
        truth = np.array(found.shares)
        truth_rows.append(
            [
                name,
                " / ".join(f"{100 * s:.1f}" for s in truth),
                " / ".join(f"{v:+.3f}±{e:.3f}" for v, e in zip(found.values, found.errors, strict=True)),
                f"{found.seconds:.0f}",
            ]
        )
        print(
            f"{name}: canonical shares {np.round(100 * truth, 1)} ({time.time() - started:.0f} s)", flush=True
        )
        for fraction in (float(f) for f in args.fractions.split(",")):
            runs = [run(settings, fraction, seed, truth) for seed in range(args.seeds)]
            pooled = sum(r.pooled for r in runs)
            pairs = sum(r.pairs for r in runs)
            refused = f"{sum(r.refused for r in runs)} of {sum(r.selected for r in runs)}"
            worth = int(sum(truth >= 0.5 / len(truth)))
            for value in VALUES:
                found_scores = [r.scores[value] for r in runs]
                rows.append(
                    [
                        name,
                        f"{fraction:g}",
                        value,
                        f"{np.mean([s.spearman for s in found_scores]):.2f}",
                        f"{np.mean([s.error for s in found_scores]):.1f}",
                        f"{sum(s.underpaid for s in found_scores)} of {worth * len(runs)}",
                        f"{pooled} of {pairs}" if value == VERDICT else "",
                        refused if value == VALUES[0] else "",
                    ]
                )
            print(f"{name} fraction {fraction:g}: done ({time.time() - started:.0f} s)", flush=True)
    print(
        f"\n{machine()}; {ROUNDS} rounds; seeds 0-{args.seeds - 1}; canonical over "
        f"{args.canonical_seeds} training seeds; {time.time() - started:.0f} s\n"
    )
    print_table(["federation", "canonical shares (%)", "canonical values ± SE", "seconds"], truth_rows)
    print()
    print_table(
        [
            "federation",
            "fraction",
            "value",
            "Spearman",
            "share error (points)",
            "worth >= 0.5/N paid < 0.5/N",
            "verdict pools pairs apart > 1/N",
            "updates turned away",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
