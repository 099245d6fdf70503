"""`fedsv study noisy --quick` end to end: real coordinator and participant processes, real training."""

from __future__ import annotations

import csv
import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsv.app.study.detection import DETECTION_METHODS
from fedsv.data import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, load_embedded

pytestmark = pytest.mark.slow


def test_quick_noisy_iid_study_detects_noisy_participants(tmp_path: Path) -> None:
    out = tmp_path / "noisy"
    proc = _study(out, [])
    assert proc.returncode == 0, proc.stdout + proc.stderr
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
    assert methods == set(DETECTION_METHODS) and "fedsv_shrunk" in methods and "random" in methods
    assert len(rows) == 2 * len(DETECTION_METHODS) * 21  # seeds x methods x (N + 1) points
    assert (out / "noisy.png").stat().st_size > 10_000
    assert "| iid-mlp |" in (out / "summary.md").read_text()

    # The same command again: every run is reused from its ledger, and the areas are identical.
    again = _study(out, [])
    assert again.returncode == 0, again.stderr
    repeated = json.loads((out / "summary.json").read_text())
    assert repeated["runs"] == {"launched": 0, "reused": 2, "launch_seconds": 0.0}
    assert again.stdout.count("reusing the finished run") == 2
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
        timeout=900,
        check=False,
    )


def _seed_rows(out: Path, seed: str) -> list[dict[str, str]]:
    with (out / "points.csv").open() as handle:
        return [row for row in csv.DictReader(handle) if row["seed"] == seed]


def _write_idx(directory: Path) -> None:
    """Fashion-MNIST's four gzipped IDX files (torchvision's layout), holding real digits of the embedded
    sample: 1,000 to train and 300 to test."""
    full = load_embedded()
    order = np.random.default_rng(0).permutation(len(full))
    raw = directory / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, index in (("train", order[:1000]), ("t10k", order[1000:1300])):
        images = np.rint(full.x[index, 0] * 255).astype(np.uint8)
        labels = full.y[index].astype(np.uint8)
        for kind, magic, array in (
            ("images-idx3", IDX_IMAGES_MAGIC, images),
            ("labels-idx1", IDX_LABELS_MAGIC, labels),
        ):
            header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
            (raw / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(header + array.tobytes()))


def test_a_reduced_paper_backdoor_study_from_idx_files(tmp_path: Path) -> None:
    """The paper's settings shrunk: IDX files on disk, validation from the test files, the backdoor as
    model replacement (boosted, no norm bound); the summary carries every field a reader needs."""
    _write_idx(tmp_path / "data")
    out = tmp_path / "backdoor"
    flags = [
        "--dataset", "fashion_mnist", "--data-dir", str(tmp_path / "data"), "--validation-from", "test",
        "--validation-size", "100", "--test-size", "0", "--participants", "10", "--fraction", "0.3",
        "--rounds", "3", "--epochs", "1", "--seeds", "1", "--partition", "iid", "--model", "mlp",
        "--backdoor", "backdoor:target=0,per_batch=20,batch_size=64+scale:10", "--update-norm-policy",
        "none", "--jobs", "1", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "fedsv", "study", "backdoor", *flags],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "backdoor iid-mlp seed 0: round   3/3" in proc.stdout  # progress per round of the run in flight
    summary = json.loads((out / "summary.json").read_text())
    config = summary["config"]
    assert (config["validation_from"], config["test_size"], config["update_norm_policy"]) == (
        "test",
        0,
        "none",
    )
    entry = summary["settings"]["iid-mlp"]
    assert set(entry["area"]) == set(DETECTION_METHODS)
    assert entry["area"]["random"]["per_seed"] == [pytest.approx(0.5, abs=1e-12)]  # the expectation
    assert entry["bad"] == {"0": [2, 3, 6]}  # bad_ranks(10, 0.3, seed 0)
    assert entry["evaluations"]["mean"] == 3 * 2**3  # three exact rounds of 3 participants
    assert entry["valuation_seconds"]["mean"] > 0 and entry["run_seconds"]["mean"] > 0
    for key in ("backdoor_success_rate", "clean_accuracy", "final_accuracy"):
        assert 0.0 <= entry[key]["mean"] <= 1.0
    assert len(entry["round_value_total"]) == 3
    assert summary["runs"]["launched"] == 1 and summary["runs"]["launch_seconds"] > 0
    report = json.loads((out / "runs" / "iid-mlp" / "seed0" / "report.json").read_text())
    assert report["config"]["corrupt"] == "2,3,6=backdoor:target=0,per_batch=20,batch_size=64+scale:10"
    assert "| valuation s / run | evaluations / run |" in (out / "summary.md").read_text()
    run_config = json.loads((out / "runs" / "iid-mlp" / "seed0" / "config.json").read_text())
    assert (run_config["validation_from"], run_config["test_size"]) == ("test", 0)


def _processes_naming(text: str) -> list[int]:
    """Pids of the live processes whose command line mentions `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
    return found


def test_sigterm_stops_a_study_and_every_process_it_started(tmp_path: Path) -> None:
    """A study killed by a scheduler (SIGTERM) ends its runs' coordinators and participants too."""
    out = tmp_path / "stopped"
    command = [
        sys.executable,
        "-m",
        "fedsv",
        "study",
        "noisy",
        "--quick",
        "--partition",
        "iid",
        "--model",
        "mlp",
    ]
    proc = subprocess.Popen(
        [*command, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait for progress: a run's first round is in
            if "round   1/" in line:
                break
        assert _processes_naming(str(out)), "the runs' processes name their directory"
        proc.terminate()
        _, error = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "fedsv study: interrupted" in error, error
    assert _processes_naming(str(out)) == []
