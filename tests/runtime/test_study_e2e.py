"""`fedsv study noisy --quick` end to end: real coordinator and participant processes, real training."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_quick_noisy_iid_study_detects_noisy_participants(tmp_path: Path) -> None:
    out = tmp_path / "noisy"
    started = time.time()
    proc = _study(out, [])
    seconds = time.time() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seconds < 120, f"--quick took {seconds:.0f} s"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["runs"]["launched"] == 2
    area = summary["settings"]["iid-mlp"]["area"]
    fedsv, random = area["fedsv"]["mean"], area["random"]["mean"]
    # Real seeded training through the runtime: the 4 of 20 participants with 30% flipped labels.
    assert fedsv >= 0.7, area
    assert fedsv >= random + 0.15, area
    assert area["fedsv_normalized"]["mean"] >= 0.85, area
    with (out / "points.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    methods = {row["method"] for row in rows}
    assert methods == {"fedsv", "loo", "fedsv_normalized", "loo_normalized", "fedsv_completed", "random"}
    assert len(rows) == 2 * 6 * 21  # seeds x methods x (N + 1) points
    assert (out / "noisy.png").stat().st_size > 10_000
    assert "| iid-mlp |" in (out / "summary.md").read_text()

    # The same command again: every run is reused from its ledger, and the areas are identical.
    again = _study(out, [])
    assert again.returncode == 0, again.stderr
    repeated = json.loads((out / "summary.json").read_text())
    assert repeated["runs"] == {"launched": 0, "reused": 2}
    assert repeated["settings"]["iid-mlp"]["area"] == area

    # Seed 0 trained afresh in another directory gives the very same curves (determinism).
    fresh = _study(tmp_path / "fresh", ["--seeds", "1"])
    assert fresh.returncode == 0, fresh.stderr
    assert _seed_rows(tmp_path / "fresh", "0") == _seed_rows(out, "0")


def _study(out: Path, extra: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fedsv", "study", "noisy", "--quick", "--partition", "iid"]
    return subprocess.run(
        [*command, "--model", "mlp", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _seed_rows(out: Path, seed: str) -> list[dict[str, str]]:
    with (out / "points.csv").open() as handle:
        return [row for row in csv.DictReader(handle) if row["seed"] == seed]
