"""The distributed runtime end to end: real coordinator and participant processes on loopback sockets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsv.ledger import Ledger
from fedsv.valuation.accounting.rounds import TOTAL_KEYS
from fedsv.valuation.round.initial_spread import INITIALIZATIONS
from tests.support.runtime import (
    SMALL,
    launch,
    ledger_digest,
    participant_argv,
    rounds_in,
    start_coordinator,
    stop,
)

pytestmark = pytest.mark.slow


def _launch(out: Path, **overrides: object) -> subprocess.CompletedProcess[str]:
    return launch(out, {**SMALL, **overrides}, timeout=300)


@pytest.fixture(scope="module")
def exact_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    out = tmp_path_factory.mktemp("runs") / "exact"
    proc = _launch(out, valuation="exact")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield out, proc


def test_launch_runs_rounds_and_writes_the_run_directory(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = exact_run
    assert "round   1/2" in proc.stdout and "round   2/2" in proc.stdout
    assert "fedsv_norm" in proc.stdout and "p00" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    for entry in report["rounds"]:
        for key in (
            "selected",
            "received",
            "utility_before",
            "utility_after",
            "values",
            "loo",
            "valuation_seconds",
            "utility_evaluations",
            "bytes_up",
            "bytes_down",
        ):
            assert key in entry
        assert len(entry["selected"]) == 3 and entry["received"] == entry["selected"]
        residual = sum(entry["values"].values()) - (entry["utility_after"] - entry["utility_before"])
        assert abs(residual) < 1e-9
        assert entry["bytes_ratio_to_minimum"] >= 1.0
    assert set(report["totals"]) == set(TOTAL_KEYS) and report["recommended"] == "fedsv_shrunk"
    # every member in every total, each with an error against a rerun (the parts in stderr_parts)
    world = {f"p{r:03d}" for r in range(report["config"]["participants"])}
    assert all(set(report["totals"][key]) == world for key in TOTAL_KEYS)
    assert set(report["stderr_parts"]) == {"estimator", "validation", "rerun", "initial"}
    # the coordinator scored other initial models when the run started: the pot's part is known
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        assert len(ledger.initial_scores()) == INITIALIZATIONS
    assert set(report["stderr_between"]) == set(TOTAL_KEYS)
    assert report["verdict"]["line"].startswith("verdict: ")
    assert 0.0 < report["final_accuracy"] <= 1.0
    rows = (out / "values.csv").read_text().strip().splitlines()
    # one row per member of the run, selected or not (a member never selected has a completed value only)
    assert len(rows) - 1 == len(report["totals"]["fedsv_completed"]) == report["config"]["participants"]
    assert (out / "values.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = subprocess.run(
        [sys.executable, "-m", "fedsv", "report", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(again.stdout)["totals"] == report["totals"]


def test_same_seed_gives_identical_ledgers(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = exact_run
    proc = _launch(tmp_path / "again", valuation="exact")
    assert proc.returncode == 0, proc.stderr
    assert ledger_digest(out) == ledger_digest(tmp_path / "again")


def test_valuation_adds_no_communication(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = exact_run
    proc = _launch(tmp_path / "none", valuation="none")
    assert proc.returncode == 0, proc.stderr
    with_valuation = ledger_digest(out)["traffic"]
    without = ledger_digest(tmp_path / "none")["traffic"]
    assert with_valuation == without
    assert with_valuation, "traffic was counted"


def test_fixed_selection_replaces_the_seeded_draw(tmp_path: Path) -> None:
    out = tmp_path / "fixed"
    proc = _launch(out, selection="1=0,2,5;2=3", valuation="exact")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
        assert [r.selected for r in rounds] == [["p000", "p002", "p005"], ["p003"]]
        assert [r.received for r in rounds] == [r.selected for r in rounds]
        assert {(v.round, v.participant) for v in ledger.values()} == {
            (1, "p000"),
            (1, "p002"),
            (1, "p005"),
            (2, "p003"),
        }


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Debian openmpi-bin) is not installed")
def test_participants_launched_by_mpirun_take_their_ranks_from_mpi(tmp_path: Path) -> None:
    state = tmp_path / "state"
    settings = {**SMALL, "participants": 4, "rounds": 1, "valuation": "exact", "metrics_port": -1}
    coordinator, port, _ = start_coordinator(state, settings)
    try:
        mpirun = subprocess.run(
            ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2",
             *participant_argv(f"127.0.0.1:{port}", None, 4)],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )  # fmt: skip
        assert mpirun.returncode == 0, mpirun.stdout[-2000:] + mpirun.stderr[-2000:]
        # an outer bound: it spawns its valuation process, values the round and writes its report
        assert coordinator.wait(timeout=600) == 0
    finally:
        stop(coordinator)
    log = (state / "coordinator.log").read_text()
    assert all(f"rank {r} joined" in log for r in range(4))
    assert rounds_in(state) == [1]


def test_distributed_run_values_equal_the_in_process_demo(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The same seed through gRPC and processes gives the values of the same rounds run in one process."""
    from fedsv.app.demo import DemoConfig, run_demo

    out, _ = exact_run
    demo = run_demo(DemoConfig(**SMALL, valuation="exact"))  # type: ignore[arg-type]
    in_process = [
        (rv.round, p, float(v))
        for rv in demo.valuation.per_round()
        for p, v in zip(rv.participants, rv.fedsv, strict=True)
    ]
    distributed = [(v[0], v[1], v[2]) for v in ledger_digest(out)["values"]]
    assert [k[:2] for k in sorted(distributed)] == [k[:2] for k in sorted(in_process)]
    assert [k[2] for k in sorted(distributed)] == pytest.approx([k[2] for k in sorted(in_process)], abs=1e-12)


def test_launch_reports_participant_processes_that_die_and_stops(tmp_path: Path) -> None:
    """Participants that cannot read their data die at once; launch says why, in a line each, and stops
    the run instead of waiting out the coordinator's join timeout (600 s)."""
    proc = _launch(tmp_path / "run", data=str(tmp_path / "absent" / "part{rank}.npz"))
    assert proc.returncode == 2, proc.stderr
    died = [line for line in proc.stdout.splitlines() if line.startswith("participant process")]
    assert len(died) == 2, proc.stdout
    assert all(
        "exited with code 2" in line and "part" in line and "participant: error:" in line for line in died
    )
    err = proc.stderr.strip()
    assert err.startswith("fedsv launch: error: every participant process exited with an error"), err
    assert "\n" not in err and "Traceback" not in proc.stdout + proc.stderr


def test_a_participant_scaling_its_delta_a_million_fold_is_turned_away_in_a_real_run(tmp_path: Path) -> None:
    """Rank 2 sends its delta x 10^6 over mTLS: the run finishes, the model stays with the honest run's,
    the update is rejected every round (never aggregated, never valued); with `--update-norm-policy
    clip` it is aggregated at the bound and the attacker's value is not above any honest one."""
    settings = {"fraction": 1.0, "rounds": 3, "valuation": "exact"}
    honest = _launch(tmp_path / "honest", **settings)
    attacked = _launch(tmp_path / "attacked", **settings, corrupt="2=scale:1e6")
    clipped = _launch(tmp_path / "clipped", **settings, corrupt="2=scale:1e6", update_norm_policy="clip")
    assert honest.returncode == 0 and attacked.returncode == 0 and clipped.returncode == 0, attacked.stderr
    with Ledger(tmp_path / "honest" / "ledger.sqlite", read_only=True) as ledger:
        honest_accuracy = ledger.rounds()[-1].test_accuracy
    with Ledger(tmp_path / "attacked" / "ledger.sqlite", read_only=True) as ledger:
        records = ledger.rounds()
    assert [r.round for r in records] == [1, 2, 3]
    assert all(r.received == [p for p in r.selected if p != "p002"] for r in records)
    assert abs(records[-1].test_accuracy - honest_accuracy) <= 0.02
    with Ledger(tmp_path / "clipped" / "ledger.sqlite", read_only=True) as ledger:
        records, rows = ledger.rounds(), ledger.values()
    assert [r.round for r in records] == [1, 2, 3] and all(r.received == r.selected for r in records)
    assert abs(records[-1].test_accuracy - honest_accuracy) <= 0.02
    totals: dict[str, float] = {}
    for row in rows:
        totals[row.participant] = totals.get(row.participant, 0.0) + row.fedsv
    assert totals["p002"] <= min(v for pid, v in totals.items() if pid != "p002")
