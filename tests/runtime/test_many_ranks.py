"""One participant process hosts hundreds of ranks on one event loop, with a handful of threads."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsv.ledger import Ledger
from tests.support.processes import wait_for
from tests.support.runtime import participant_argv, rounds_in, spawn, start_coordinator, stop, tail

pytestmark = pytest.mark.slow

RANKS = 300
RUN: dict[str, object] = {
    "participants": RANKS,
    "fraction": 3 / RANKS,  # 3 selected a round
    "rounds": 2,
    "epochs": 1,
    "validation_size": 200,
    "seed": 3,
    "valuation": "loo",
    "join_timeout": 600,
    "round_timeout": 600,
}
GENEROUS = 600.0  # outer bounds only: a shared 2-core machine may be slow; nothing here times progress


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no Threads line")


def test_one_process_plays_300_ranks_with_few_threads(tmp_path: Path) -> None:
    coordinator, port, _ = start_coordinator(tmp_path / "state", RUN)
    log = tmp_path / "participants.log"
    participants = spawn(participant_argv(f"127.0.0.1:{port}", f"0-{RANKS - 1}", RANKS), log)
    threads: list[int] = []

    def progressed(target: int) -> bool:
        assert participants.poll() is None or participants.returncode == 0, tail(log)
        if participants.poll() is None:
            threads.append(_threads(participants.pid))
        return len(rounds_in(tmp_path / "state")) >= target

    try:
        wait_for(lambda: progressed(1), GENEROUS, "round 1 (all 300 ranks joined and subscribed)", 0.5)
        held = max(threads)
        wait_for(lambda: progressed(2), GENEROUS, "round 2", 0.5)
        assert participants.wait(timeout=GENEROUS) == 0, tail(log)  # every rank saw the run end
        assert coordinator.wait(timeout=GENEROUS) == 0, tail(tmp_path / "state" / "coordinator.log")
    finally:
        stop(participants, coordinator)
    assert held < 50, f"{held} threads in a process playing {RANKS} ranks"
    assert max(threads) < 50, f"{max(threads)} threads in a process playing {RANKS} ranks"
    with Ledger(tmp_path / "state" / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
    assert [r.round for r in rounds] == [1, 2]
    for record in rounds:
        # every selected rank's update reached the coordinator: aggregated, or turned away by the guard
        # (with 300 shards of about 12 images, an honest update may point against the referee's descent)
        assert len(record.selected) == 3
        assert sorted([*record.received, *record.refused]) == record.selected, record
