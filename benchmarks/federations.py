"""The federations the calibration benchmark reruns: fixed member files, each rerun another seed and a
fresh validation draw.

Each federation is its members' own files (written once, so every rerun holds the same data), a
validation file bootstrapped anew per rerun, a test file, the run's settings, and which members are
twins (identical files) or corrupted. Five shapes, on three real data sets that install with the
project (no download):

- `tabular-twins`: the tabular example's eight breast-cancer members, each twice (16 members, 8 per
  round): the federation the error model was first checked on.
- `digits-owners`: scikit-learn's handwritten digits (1,797 8x8 images), eight owners of 30 to 200
  images, one with half its labels flipped, one holding only the digits 0-4, each with a twin (16
  members, 8 per round): a federation nobody tuned on.
- `digits-silos`: the same digits in five silos of 60 to 400 images, one with a quarter of its labels
  flipped, all five selected in every round (cross-silo).
- `mnist-corrupted`: the embedded MNIST sample's paper setup (20 IID shards, 10 per round, the paper's
  MLP) with members 0 and 1 on half-flipped labels and member 2 holding 20 images.
- `main-job`: `make demo`'s federation (the embedded MNIST in 10 IID shards, 5 per round; members 0
  and 1 on half-flipped labels, member 2 holding 30 images, member 3 a mimicking free rider).

The ground-truth benchmark's federations (`GROUND_TRUTH`) are six digits members each, small enough to
retrain all 64 coalitions: IID shards of 150 images; two classes each, two members sharing theirs; IID
with one member on half-flipped labels; IID with one member holding 30 images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from fedsv.task import Task

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class Digits(Task):
    """scikit-learn's digits as a table: 64 pixel columns scaled to [0, 1], label column "target"."""

    label = "target"

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


digits_task = Digits()


@dataclass(frozen=True)
class Federation:
    """A federation's files and settings: `settings` are DemoConfig fields (data, validation and test
    files filled in per rerun), `twins` pairs of members holding identical files, `corrupted` members
    with damaged data."""

    name: str
    settings: dict[str, Any]
    validation: str  # the file each rerun bootstraps
    twins: list[tuple[str, str]] = field(default_factory=list)
    corrupted: list[str] = field(default_factory=list)

    def rerun(self, work: Path, seed: int) -> dict[str, Any]:
        """The DemoConfig fields of rerun `seed`: its seed and its own bootstrap of the validation file."""
        source = Path(self.validation)
        drawn = work / f"{self.name}-validation{seed}{source.suffix}"
        if not drawn.exists():
            rng = np.random.default_rng(1000 + seed)
            if source.suffix == ".npz":
                data = np.load(source)
                pick = rng.integers(0, len(data["y"]), len(data["y"]))
                np.savez(drawn, x=data["x"][pick], y=data["y"][pick])
            else:
                table = pd.read_csv(source)
                table.iloc[rng.integers(0, len(table), len(table))].to_csv(drawn, index=False)
        return {**self.settings, "seed": seed, "validation_data": str(drawn)}


def _pid(rank: int) -> str:
    return f"p{rank:03d}"


def tabular_twins(work: Path) -> Federation:
    data = ROOT / "examples/tabular/data"
    if not (data / "validation.csv").exists():
        import subprocess
        import sys

        subprocess.run([sys.executable, str(ROOT / "examples/tabular/prepare.py")], check=True)
    folder = work / "tabular-twins"
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(8):
        for copy in (rank, rank + 8):
            (folder / f"member{copy}.csv").write_bytes((data / f"member{rank}.csv").read_bytes())
    settings = {
        "task": str(ROOT / "examples/tabular/task.py:task"),
        "data": str(folder / "member{rank}.csv"),
        "test_data": str(data / "test.csv"),
        "participants": 16,
        "fraction": 0.5,
    }
    twins = [(_pid(r), _pid(r + 8)) for r in range(8)]
    return Federation("tabular-twins", settings, str(data / "validation.csv"), twins, [_pid(5), _pid(13)])


def _digits_table() -> pd.DataFrame:
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame
    features = frame.columns.drop("target")
    frame[features] = frame[features] / 16.0
    rng = np.random.default_rng(0)
    return frame.iloc[rng.permutation(len(frame))].reset_index(drop=True)


def _write_digits(folder: Path, table: pd.DataFrame) -> tuple[pd.DataFrame, str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    table.iloc[:300].to_csv(folder / "validation.csv", index=False)
    table.iloc[300:600].to_csv(folder / "test.csv", index=False)
    return table.iloc[600:].reset_index(drop=True), str(folder / "validation.csv"), str(folder / "test.csv")


def _digits_settings(folder: Path, test: str, participants: int, fraction: float) -> dict[str, Any]:
    """The run settings of a digits federation whose member files are in `folder`."""
    return {
        "task": str(HERE / "federations.py:digits_task"),
        "data": str(folder / "member{rank}.csv"),
        "test_data": test,
        "participants": participants,
        "fraction": fraction,
    }


def _flip(part: pd.DataFrame, share: float, seed: int) -> pd.DataFrame:
    part = part.copy()
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(part), size=round(share * len(part)), replace=False)
    labels = part["target"].to_numpy().copy()
    labels[chosen] = (labels[chosen] + rng.integers(1, 10, size=len(chosen))) % 10
    part["target"] = labels
    return part


def digits_owners(work: Path) -> Federation:
    folder = work / "digits-owners"
    rest, validation, test = _write_digits(folder, _digits_table())
    sizes, noisy, half = (30, 50, 70, 90, 120, 150, 160, 200), 3, 6
    start = 0
    for rank, size in enumerate(sizes):
        pool = rest.iloc[start:]
        if rank == half:  # only the digits 0-4
            pool = pool[pool["target"] < 5]
        part = pool.iloc[:size]
        start = int(part.index.max()) + 1
        if rank == noisy:
            part = _flip(part, 0.5, seed=rank)
        for copy in (rank, rank + 8):
            part.to_csv(folder / f"member{copy}.csv", index=False)
    twins = [(_pid(r), _pid(r + 8)) for r in range(8)]
    settings = _digits_settings(folder, test, 16, 0.5)
    return Federation("digits-owners", settings, validation, twins, [_pid(noisy), _pid(noisy + 8)])


def digits_silos(work: Path) -> Federation:
    folder = work / "digits-silos"
    rest, validation, test = _write_digits(folder, _digits_table())
    sizes, noisy, start = (60, 120, 200, 300, 400), 1, 0
    for rank, size in enumerate(sizes):
        part = rest.iloc[start : start + size]
        start += size
        if rank == noisy:
            part = _flip(part, 0.25, seed=rank)
        part.to_csv(folder / f"member{rank}.csv", index=False)
    settings = _digits_settings(folder, test, 5, 1.0)
    return Federation("digits-silos", settings, validation, [], [_pid(noisy)])


def _embedded_shards(folder: Path, members: int, small: int) -> dict[str, Any]:
    """The embedded MNIST sample's IID shards as member files in `folder`: members 0 and 1 on
    half-flipped labels, member 2 holding `small` images; and the settings that read them."""
    from fedsv.data.shards import Holdout, Simulation

    folder.mkdir(parents=True, exist_ok=True)
    simulation = Simulation.parse("simulated:embedded", "", 0, Holdout(1000, "train", 1000))
    for rank in range(members):
        samples, _ = simulation.shard(rank, members, "iid", "flip:0.5" if rank < 2 else "none")
        x, y = np.asarray(samples.x), np.asarray(samples.y)
        if rank == 2:
            x, y = x[:small], y[:small]
        np.savez(folder / f"member{rank}.npz", x=x, y=y)
    for name, part in (("validation", simulation.validation()), ("test", simulation.test())):
        np.savez(folder / f"{name}.npz", x=np.asarray(part.x), y=np.asarray(part.y))
    return {
        "data": str(folder / "member{rank}.npz"),
        "test_data": str(folder / "test.npz"),
        "participants": members,
        "fraction": 0.5,
    }


def mnist_corrupted(work: Path) -> Federation:
    folder = work / "mnist-corrupted"
    settings = _embedded_shards(folder, 20, 20)
    return Federation("mnist-corrupted", settings, str(folder / "validation.npz"), [], [_pid(0), _pid(1)])


def main_job(work: Path) -> Federation:
    """`make demo`'s federation (Makefile's DEMO_FEDERATION) with its members' shards as files."""
    folder = work / "main-job"
    settings = {**_embedded_shards(folder, 10, 30), "corrupt": "3=mimic:1"}
    return Federation("main-job", settings, str(folder / "validation.npz"), [], [_pid(0), _pid(1), _pid(3)])


BUILDERS = {
    "tabular-twins": tabular_twins,
    "digits-owners": digits_owners,
    "digits-silos": digits_silos,
    "mnist-corrupted": mnist_corrupted,
    "main-job": main_job,
}


def _ground_truth(work: Path, name: str, parts: list[pd.DataFrame]) -> Federation:
    """Six digits members' files under `work/name`, and the settings that read them (half per round)."""
    folder = work / name
    _, validation, test = _write_digits(folder, _digits_table())
    for rank, part in enumerate(parts):
        part.to_csv(folder / f"member{rank}.csv", index=False)
    return Federation(name, _digits_settings(folder, test, len(parts), 0.5), validation)


def _iid_parts(sizes: list[int]) -> list[pd.DataFrame]:
    rest = _digits_table().iloc[600:].reset_index(drop=True)
    starts = np.cumsum([0, *sizes])
    return [rest.iloc[starts[i] : starts[i + 1]] for i in range(len(sizes))]


def gt_iid(work: Path) -> Federation:
    return _ground_truth(work, "gt-iid", _iid_parts([150] * 6))


def gt_shared_classes(work: Path) -> Federation:
    """Two classes per member of 120 images: members 0 and 1 both hold the digits 0 and 1 (60 of each,
    no image twice); members 2-5 hold 2-3, 4-5, 6-7 and 8-9."""
    rest = _digits_table().iloc[600:].reset_index(drop=True)
    pairs = [(0, 1), (0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    parts = []
    for rank, pair in enumerate(pairs):
        offset = 60 if rank == 1 else 0
        parts.append(pd.concat([rest[rest["target"] == c].iloc[offset : offset + 60] for c in pair]))
    return _ground_truth(work, "gt-shared-classes", parts)


def gt_noisy(work: Path) -> Federation:
    parts = _iid_parts([150] * 6)
    parts[0] = _flip(parts[0], 0.5, seed=0)
    return _ground_truth(work, "gt-noisy", parts)


def gt_small(work: Path) -> Federation:
    return _ground_truth(work, "gt-small", _iid_parts([30] + [150] * 5))


GROUND_TRUTH = {
    "iid": gt_iid,
    "shared-classes": gt_shared_classes,
    "noisy": gt_noisy,
    "small": gt_small,
}
