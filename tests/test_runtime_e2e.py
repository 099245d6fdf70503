"""The distributed runtime end to end: real coordinator and participant processes on loopback sockets."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.ledger import Ledger

pytestmark = pytest.mark.slow

SMALL = {
    "participants": 6,
    "fraction": 0.5,
    "rounds": 2,
    "epochs": 1,
    "validation_size": 200,
    "seed": 3,
}


def _flags(settings: dict[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in settings.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def _launch(out: Path, **overrides: object) -> subprocess.CompletedProcess[str]:
    settings = {**SMALL, **overrides}
    return subprocess.run(
        [sys.executable, "-m", "fedsv", "launch", *_flags(settings), "--out", str(out), "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _ledger_digest(run_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    with Ledger(run_dir / "ledger.sqlite", read_only=True) as ledger:
        rounds = [
            (
                r.round,
                r.selected,
                r.received,
                r.stragglers,
                r.utility_before,
                r.utility_after,
                r.test_accuracy,
                r.method,
                r.evaluations,
            )
            for r in ledger.rounds()
        ]
        values = [(v.round, v.participant, v.fedsv, v.loo) for v in ledger.values()]
        traffic = [(t.round, t.rpc, t.direction, t.bytes, t.messages) for t in ledger.traffic()]
    return {"rounds": rounds, "values": values, "traffic": traffic}


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
    assert set(report["totals"]) == {"fedsv", "fedsv_normalized", "loo", "loo_normalized"}
    assert 0.0 < report["final_accuracy"] <= 1.0
    rows = (out / "values.csv").read_text().strip().splitlines()
    assert len(rows) - 1 == len(report["totals"]["fedsv"])
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
    assert _ledger_digest(out) == _ledger_digest(tmp_path / "again")


def test_valuation_adds_no_communication(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = exact_run
    proc = _launch(tmp_path / "none", valuation="none")
    assert proc.returncode == 0, proc.stderr
    with_valuation = _ledger_digest(out)["traffic"]
    without = _ledger_digest(tmp_path / "none")["traffic"]
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _coordinator(state: Path, port: int, **settings: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coordinator",
            *_flags({**SMALL, **settings}),
            "--state-dir",
            str(state),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "-1",
            "--log-level",
            "INFO",
        ],
        stdout=open(state / "coordinator.log", "a"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def _participants(port: int, ranks: str, log: Path, world_size: int = 6) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "participant",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--world-size",
            str(world_size),
            "--ranks",
            ranks,
            "--log-level",
            "INFO",
        ],
        stdout=open(log, "a"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _rounds_in(state: Path) -> list[int]:
    if not (state / "ledger.sqlite").exists():
        return []
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        return [r.round for r in ledger.rounds()]


def test_killed_coordinator_restarts_and_resumes_the_run(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    reference, _ = exact_run
    state = tmp_path / "state"
    state.mkdir()
    port = _free_port()
    settings = {"valuation": "exact", "rounds": 3}
    coordinator = _coordinator(state, port, **settings)
    workers = _participants(port, "0-5", tmp_path / "participants.log")
    try:
        _wait_for(lambda: _rounds_in(state) == [1], 120, "round 1 in the ledger")
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=30)
        coordinator = _coordinator(state, port, **settings)
        assert coordinator.wait(timeout=240) == 0, (state / "coordinator.log").read_text()[-2000:]
        assert workers.wait(timeout=60) == 0
    finally:
        for proc in (coordinator, workers):
            if proc.poll() is None:
                proc.kill()
    assert _rounds_in(state) == [1, 2, 3]
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        assert ledger.integrity_ok()
        checkpoint = ledger.last_checkpoint()
        assert checkpoint is not None and checkpoint.round == 3
    # rounds 1-2 equal those of the uninterrupted run with the same seed (it ran 2 rounds)
    resumed = _ledger_digest(state)
    straight = _ledger_digest(reference)
    assert resumed["rounds"][:2] == straight["rounds"]
    assert [v for v in resumed["values"] if v[0] <= 2] == straight["values"]


def test_participant_killed_mid_round_leaves_a_quorum_round(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    port = _free_port()
    coordinator = _coordinator(
        state,
        port,
        participants=4,
        fraction=1.0,
        rounds=1,
        valuation="exact",
        round_timeout=12,
        quorum=0.5,
        epochs=5,
    )
    healthy = _participants(port, "0-2", tmp_path / "healthy.log", world_size=4)
    victim: subprocess.Popen[str] | None = None
    log = state / "coordinator.log"
    try:
        victim = _participants(port, "3", tmp_path / "victim.log", world_size=4)
        # The round opens once all four listen; the victim dies while it trains (5 local epochs).
        _wait_for(lambda: "round 1: selected" in log.read_text(), 120, "round 1 to open")
        victim.send_signal(signal.SIGKILL)
        assert coordinator.wait(timeout=120) == 0, log.read_text()[-2000:]
        assert healthy.wait(timeout=60) == 0
    finally:
        for proc in (coordinator, healthy, victim):
            if proc is not None and proc.poll() is None:
                proc.kill()
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        (record,) = ledger.rounds()
        assert record.selected == ["p000", "p001", "p002", "p003"]
        assert record.received == ["p000", "p001", "p002"] and record.stragglers == ["p003"]
        assert {v.participant for v in ledger.values()} == {"p000", "p001", "p002"}


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Debian openmpi-bin) is not installed")
def test_participants_launched_by_mpirun_take_their_ranks_from_mpi(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    port = _free_port()
    coordinator = _coordinator(state, port, participants=4, fraction=0.5, rounds=1, valuation="exact")
    mpirun = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "2",
            sys.executable,
            "-m",
            "participant",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--world-size",
            "4",
            "--log-level",
            "INFO",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    try:
        assert mpirun.returncode == 0, mpirun.stdout[-2000:] + mpirun.stderr[-2000:]
        assert coordinator.wait(timeout=60) == 0
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    log = (state / "coordinator.log").read_text()
    assert all(f"rank {r} joined" in log for r in range(4))
    assert _rounds_in(state) == [1]


def test_distributed_run_values_equal_the_in_process_demo(
    exact_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The same seed through gRPC and processes gives the values of the same rounds run in one process."""
    from fedsv.demo import DemoConfig, run_demo

    out, _ = exact_run
    demo = run_demo(DemoConfig(**SMALL, valuation="exact"))  # type: ignore[arg-type]
    in_process = [
        (rv.round, p, float(v))
        for rv in demo.valuation.per_round()
        for p, v in zip(rv.participants, rv.fedsv, strict=True)
    ]
    distributed = [(v[0], v[1], v[2]) for v in _ledger_digest(out)["values"]]
    assert [k[:2] for k in sorted(distributed)] == [k[:2] for k in sorted(in_process)]
    assert [k[2] for k in sorted(distributed)] == pytest.approx([k[2] for k in sorted(in_process)], abs=1e-12)
