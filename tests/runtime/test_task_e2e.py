"""Bring your own model and data: a task file outside the package, each participant reading its own file."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsv.ledger import Ledger
from tests.support.runtime import check_ledger, start_coordinator, start_participants, stop, tail

REPO = Path(__file__).resolve().parents[2]
TASK = '''
from torch import nn
from fedsv.task import Task

class Blobs(Task):
    """Six features, three classes; the loaders are the defaults (an .npz with x and y)."""
    def build_model(self):
        return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))

task = Blobs()
'''
SIZES = (30, 45, 60, 75)  # each participant's own file holds a different number of samples


GUARD_REASONS = ("against_validation", "direction_rejected", "norm_rejected", "quarantined")
"""Why the guard turns an update away."""


def _blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    centers = np.array([[2, 0, 0, 1, 0, 0], [0, 2, 0, 0, 1, 0], [0, 0, 2, 0, 0, 1]], dtype=np.float32)
    return (centers[y] + rng.normal(scale=0.8, size=(n, 6))).astype(np.float32), y


@pytest.mark.slow
def test_a_task_outside_the_package_runs_through_real_processes(tmp_path: Path) -> None:
    task_file = tmp_path / "blobs_task.py"
    task_file.write_text(TASK)
    data = tmp_path / "data"
    data.mkdir()
    for rank, size in enumerate(SIZES):
        x, y = _blobs(size, rank)
        np.savez(data / f"part{rank}.npz", x=x, y=y)
    x, y = _blobs(150, 99)
    np.savez(data / "validation.npz", x=x, y=y)
    state = tmp_path / "state"
    settings = {
        "participants": 4, "fraction": 1.0, "rounds": 3, "epochs": 2, "seed": 1, "valuation": "exact",
        "task": f"{task_file}:task", "validation_data": data / "validation.npz", "metrics_port": -1,
    }  # fmt: skip
    coordinator, port, _ = start_coordinator(state, settings)
    own_data = ["--task", f"{task_file}:task", "--data", str(data / "part{rank}.npz")]
    workers = [
        start_participants(f"127.0.0.1:{port}", ranks, 4, tmp_path / f"{ranks}.log", *own_data)
        for ranks in ("0-1", "2-3")
    ]
    try:
        assert coordinator.wait(timeout=300) == 0, tail(state / "coordinator.log")
        for worker, ranks in zip(workers, ("0-1", "2-3"), strict=True):
            assert worker.wait(timeout=600) == 0, tail(tmp_path / f"{ranks}.log")
    finally:
        stop(coordinator, *workers)
    assert check_ledger(state) == [1, 2, 3]
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        rounds, values, updates = ledger.rounds(), ledger.values(), ledger.updates()
    for record in rounds:
        total = sum(v.fedsv for v in values if v.round == record.round)
        assert total == pytest.approx(record.utility_after - record.utility_before, abs=1e-9)
        assert record.received == ["p000", "p001", "p002", "p003"]
    # FedAvg weighed each update by the count its participant declared at Join: its own file's size.
    assert {(u.participant, u.num_samples) for u in updates} == {
        (f"p{rank:03d}", size) for rank, size in enumerate(SIZES)
    }
    assert rounds[-1].utility_after > 0.8  # the blobs are learnable: the federation learned them
    # The operator's report works on the coordinator's own state directory.
    report = subprocess.run(
        [sys.executable, "-m", "fedsv", "report", str(state), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(report.stdout)
    assert summary["rounds"][0]["num_samples"] == {f"p{r:03d}": s for r, s in enumerate(SIZES)}


@pytest.mark.slow
def test_the_tabular_example_ranks_the_wrong_label_member_last(tmp_path: Path) -> None:
    """examples/tabular as its README runs it: real data from scikit-learn, eight members, `fedsv launch`."""
    data, out = tmp_path / "data", tmp_path / "run"
    example = REPO / "examples" / "tabular"
    subprocess.run([sys.executable, str(example / "prepare.py"), "--out", str(data)], check=True, timeout=120)
    launch = [
        sys.executable, "-m", "fedsv", "launch", "--task", f"{example / 'task.py'}:task",
        "--validation-data", str(data / "validation.csv"), "--test-data", str(data / "test.csv"),
        "--data", str(data / "member{rank}.csv"), "--participants", "8", "--fraction", "1.0",
        "--rounds", "5", "--valuation", "exact", "--insecure", "--processes", "2", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(launch, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + tail(out / "coordinator.log")
    with (out / "values.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    ranked = sorted(rows, key=lambda row: int(row["rank"]))
    assert ranked[-1]["participant"] == "p005", ranked  # the member whose labels are all wrong
    assert float(ranked[-1]["fedsv"]) <= 0 < min(float(row["fedsv"]) for row in ranked[:-1])
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:  # turned away, or valued below 0
        turned_away = [r.round for r in ledger.rounds() if "p005" not in r.received]
        valued = [v.fedsv for v in ledger.values() if v.participant == "p005"]
    assert turned_away or sum(valued) < 0
    report = json.loads((out / "report.json").read_text())  # in every report, with why it was absent
    assert all("p005" in report["totals"][key] for key in report["totals"])
    for entry in report["rounds"]:
        assert entry["round"] not in turned_away or entry["absent"]["p005"] in GUARD_REASONS
    assert all(value < 0 for value in valued), valued
    counts = {row["participant"]: row["num_samples"] for row in rows}
    assert counts["p007"] == "67" and counts["p005"] in ("44", "")  # "": none of its updates aggregated
    # and the payout gives it nothing under --negative zero, the budget split among the others
    paid = subprocess.run(
        [sys.executable, "-m", "fedsv", "payout", str(out), "--amount", "1000", "--negative", "zero"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert paid.returncode == 0, paid.stderr
    with (out / "payout.csv").open() as handle:
        shares = {row["participant"]: float(row["amount"]) for row in csv.DictReader(handle)}
    assert shares["p005"] == 0.0 and sum(shares.values()) == pytest.approx(1000.0)
    assert all(amount > 0 for pid, amount in shares.items() if pid != "p005")
