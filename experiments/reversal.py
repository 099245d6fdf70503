"""Why noisy participants out-value clean ones in non-IID studies: their values split by validation label.

For every non-IID run of the given study directories, each participant's FedSV total is split (per-label
values, exact and additive) into the part earned on the classes it holds and the part earned on the
others; the first table compares noisy and clean participants. The second gives detection areas
(random: 0.5) of the total value (low = suspicious) and of the value off a participant's own labels
(high = suspicious), its own labels guessed from its per-label values alone (its `--own-labels`
largest), as a coordinator would have to. Run after a study:

    python experiments/reversal.py runs/paper/noisy-fashion-mnist [runs/paper/noisy-own-fashion-mnist ...]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from fedsv.app.study.detection import detection_area
from fedsv.data import load_dataset
from fedsv.data.partition import partition_indices
from fedsv.fl.ranks import participant_id
from fedsv.settings.run import RunConfig


@dataclass(frozen=True)
class Split:
    """Mean over participants of one group (noisy or clean) of a run's values."""

    total: float
    own: float
    other: float
    count: int


def _run_config(directory: Path) -> RunConfig:
    recorded = json.loads((directory / "config.json").read_text())
    names = {f.name for f in fields(RunConfig)}
    return RunConfig(**{k: v for k, v in recorded.items() if k in names})


def own_classes(run: RunConfig) -> list[set[int]]:
    """The labels each rank's shard holds (the run's own split and partition)."""
    holdout = run.holdout()
    splits = load_dataset(
        run.dataset,
        run.data_dir or None,
        seed=run.seed,
        validation_size=holdout.validation_size,
        validation_from=holdout.validation_from,
        test_size=holdout.test_size,
    )
    parts = partition_indices(splits.train.y, run.participants, run.partition, run.seed)
    return [set(np.unique(splits.train.y[index]).tolist()) for index in parts]


def detection(directory: Path, own_labels: int) -> tuple[float, float]:
    """Detection areas of the total value (low first) and of the value off the participant's `own_labels`
    largest per-label values (high first), over every participant of the run (never valued: 0)."""
    run = _run_config(directory)
    by_label = json.loads((directory / "report.json").read_text())["classes"]["totals"]
    flags = np.isin(np.arange(run.participants), sorted(run.corruptions()))
    values = [np.asarray(by_label.get(participant_id(rank), [0.0])) for rank in range(run.participants)]
    totals = np.array([v.sum() for v in values])
    off_own = np.array([v.sum() - np.sort(v)[-own_labels:].sum() for v in values])
    return detection_area(totals, flags), detection_area(-off_own, flags)


def run_splits(directory: Path) -> dict[str, Split]:
    """noisy / clean -> mean total, own-class and other-class value of the participants ever valued."""
    run = _run_config(directory)
    report = json.loads((directory / "report.json").read_text())
    by_label = report["classes"]["totals"]
    noisy = set(run.corruptions())
    classes = own_classes(run)
    groups: dict[str, list[tuple[float, float, float]]] = {"noisy": [], "clean": []}
    for rank in range(run.participants):
        values = by_label.get(participant_id(rank))
        if values is None:
            continue  # never valued
        own = sum(v for label, v in enumerate(values) if label in classes[rank])
        groups["noisy" if rank in noisy else "clean"].append((float(sum(values)), own, sum(values) - own))
    out = {}
    for name, rows in groups.items():
        if rows:
            total, own, other = (float(np.mean(column)) for column in zip(*rows, strict=True))
            out[name] = Split(total, own, other, len(rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path, help="study directories (their runs/noniid-*/seed*)")
    parser.add_argument(
        "--own-labels", type=int, default=2, help="labels each participant holds (non-IID: 2)"
    )
    args = parser.parse_args()
    print("| study | setting | group | participants | FedSV total | on own classes | on other classes |")
    print("|---|---|---|---|---|---|---|")
    for study in args.studies:
        for setting in sorted((study / "runs").glob("noniid-*")):
            seeds = [run_splits(d) for d in sorted(setting.glob("seed*")) if (d / "report.json").is_file()]
            for group in ("noisy", "clean"):
                rows = [s[group] for s in seeds if group in s]
                if not rows:
                    continue
                mean = {k: np.mean([getattr(r, k) for r in rows]) for k in ("total", "own", "other")}
                count = sum(r.count for r in rows)
                print(
                    f"| {study.name} | {setting.name} | {group} | {count} | {mean['total']:+.4f} | "
                    f"{mean['own']:+.4f} | {mean['other']:+.4f} |"
                )
    print("\n| study | setting | seeds | area: FedSV total, low first | area: off own labels, high first |")
    print("|---|---|---|---|---|")
    for study in args.studies:
        for setting in sorted((study / "runs").glob("noniid-*")):
            runs = [d for d in sorted(setting.glob("seed*")) if (d / "report.json").is_file()]
            areas = np.array([detection(d, args.own_labels) for d in runs])
            if len(areas):
                cells = [f"{areas[:, k].mean():.3f} ± {areas[:, k].std():.3f}" for k in (0, 1)]
                print(f"| {study.name} | {setting.name} | {len(runs)} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
