"""The runtime's gaps closed: a refused update does not hold its round, a displaced participant comes
back, and participants that reconnect after the run ended still read its end."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from prometheus_client import CollectorRegistry

from fedsv.coordinator.server import Coordinator
from fedsv.coordinator.server_config import ServerConfig
from fedsv.participant.host import run_alone
from fedsv.participant.local import LocalRank
from fedsv.participant.worker import RankWorker
from fedsv.security import certs
from fedsv.settings.run import RunConfig
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, **overrides: Any) -> ServerConfig:
    settings: dict[str, Any] = {
        "state_dir": str(tmp_path / "state"), "host": "127.0.0.1", "port": 0, "metrics_port": -1,
        "health_port": -1, "join_timeout": 120.0, "linger": 0.0, **overrides,
    }  # fmt: skip
    if "tls_dir" not in settings:
        settings["insecure"] = True
    return ServerConfig(**settings)


def _play(workers: list[RankWorker]) -> tuple[dict[int, str], list[threading.Thread]]:
    results: dict[int, str] = {}
    threads = [
        threading.Thread(target=lambda w=w: results.update({w.rank: str(run_alone(w))})) for w in workers
    ]
    for thread in threads:
        thread.start()
    return results, threads


def _wait(predicate: Any, what: str, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, what
        time.sleep(0.05)


def _rank_2_refused_under_mutual_tls(tmp_path: Path, reason: str) -> dict[int, str]:
    """Three ranks under mutual TLS, one round with a 600 s deadline, rank 2's update refused: the
    round closes once the other two are in (not at the deadline) and records rank 2 with `reason`.
    The ranks' results."""
    tls = tmp_path / "certs"
    certs.generate(tls, 3)
    registry = CollectorRegistry()
    run = RunConfig(participants=3, fraction=1.0, rounds=1, epochs=1, validation_size=100)
    coordinator = Coordinator(
        run, _config(tmp_path, tls_dir=str(tls), round_timeout=600.0), registry=registry
    )
    coordinator.start()
    try:
        target = f"localhost:{coordinator.port}"
        workers = [RankWorker(target, r, 3, tls_dir=str(tls), give_up_after=120) for r in range(3)]
        results, threads = _play(workers)
        started = time.time()
        assert str(coordinator.run()) == "finished"
        assert time.time() - started < 300  # not the 600 s deadline
        for thread in threads:
            thread.join(timeout=120)
        (record,) = coordinator.ledger.rounds()
        assert record.received == ["p000", "p001"] and record.stragglers == []
        assert record.refused == {"p002": reason}  # in the round's record, with why
        assert registry.get_sample_value("fedsv_updates_rejected_total", {"reason": reason}) == 1
        return results
    finally:
        coordinator.stop()


def test_a_non_finite_update_does_not_hold_its_round_under_mutual_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 2 trains to NaN: its update is refused (INVALID_ARGUMENT) and the round closes once the
    other two are in, not at the 600 s deadline."""
    real_train = LocalRank.train

    def train(self: LocalRank, *args: Any) -> dict[str, torch.Tensor]:
        delta = real_train(self, *args)
        if self.rank == 2:
            delta = {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in delta.items()
            }
        return delta

    monkeypatch.setattr(LocalRank, "train", train)
    results = _rank_2_refused_under_mutual_tls(tmp_path, "non_finite")
    assert results == {0: "finished", 1: "finished", 2: "finished"}


def test_a_count_contradicting_the_join_does_not_hold_its_round_under_mutual_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 2 declares one sample more in its update than at Join: refused (sample_count_mismatch),
    recorded with that reason, and the round closes once the other two are in, not at the deadline."""
    real_train, real_count = LocalRank.train, LocalRank.declared_samples

    def train(self: LocalRank, *args: Any) -> dict[str, torch.Tensor]:
        self.trained = True  # type: ignore[attr-defined]
        return real_train(self, *args)

    def declared(self: LocalRank) -> int:
        count = real_count.fget(self)  # type: ignore[attr-defined]
        return count + 1 if self.rank == 2 and getattr(self, "trained", False) else count

    monkeypatch.setattr(LocalRank, "train", train)
    monkeypatch.setattr(LocalRank, "declared_samples", property(declared))
    _rank_2_refused_under_mutual_tls(tmp_path, "sample_count_mismatch")


def test_a_displaced_participant_joins_again_with_a_new_session(tmp_path: Path) -> None:
    """Someone joins as p000 while p000 holds its task stream: p000's stream ends, p000 joins again
    (replacing the intruder's session) and takes part in every round."""
    run = RunConfig(participants=2, fraction=1.0, rounds=2, epochs=1, validation_size=100)
    coordinator = Coordinator(run, _config(tmp_path), registry=CollectorRegistry())
    coordinator.start()
    try:
        target = f"127.0.0.1:{coordinator.port}"
        sessions = coordinator.state.sessions
        workers = [RankWorker(target, r, 2, give_up_after=120) for r in range(2)]
        results, threads = _play(workers)
        _wait(lambda: sessions.connected() == 2, "the participants never subscribed")
        with grpc.insecure_channel(target) as channel:
            intruder = fedsv_pb2_grpc.CoordinatorStub(channel).Join(
                fedsv_pb2.JoinRequest(rank=0, world_size=2, num_samples=950), timeout=30
            )
        _wait(lambda: sessions.participants["p000"].token != intruder.session_token, "p000 never came back")
        _wait(lambda: sessions.connected() == 2, "p000 never subscribed again")
        assert str(coordinator.run()) == "finished"
        for thread in threads:
            thread.join(timeout=120)
        assert results == {0: "finished", 1: "finished"}
        assert [r.received for r in coordinator.ledger.rounds()] == [["p000", "p001"], ["p000", "p001"]]
    finally:
        coordinator.stop()


def test_participants_reconnecting_after_the_end_read_it_and_finish(tmp_path: Path) -> None:
    """A coordinator restarted after the last round has nothing left to run; it serves until every
    participant has read the end (within --end-grace), so participants that reconnect late exit 0."""
    run = RunConfig(participants=2, fraction=1.0, rounds=1, epochs=1, validation_size=100)
    first = Coordinator(run, _config(tmp_path), registry=CollectorRegistry())
    first.start()
    try:
        target = f"127.0.0.1:{first.port}"
        results, threads = _play([RankWorker(target, r, 2, give_up_after=120) for r in range(2)])
        assert str(first.run()) == "finished"
        for thread in threads:
            thread.join(timeout=120)
    finally:
        first.stop()
    restarted = Coordinator(run, _config(tmp_path, end_grace=600.0), registry=CollectorRegistry())
    restarted.start()
    try:
        outcome: list[str] = []
        loop = threading.Thread(target=lambda: outcome.append(str(restarted.run())))
        loop.start()
        time.sleep(1.0)  # the participants come back after the run has ended
        late = [RankWorker(f"127.0.0.1:{restarted.port}", r, 2, give_up_after=120) for r in range(2)]
        results, threads = _play(late)
        for thread in threads:
            thread.join(timeout=180)
        assert results == {0: "finished", 1: "finished"}
        # A participant lets the coordinator close the stream that carried the end instead of
        # cancelling it, so it is counted as told before its worker returns (a cancel racing the
        # stream's last step once left the coordinator waiting out its grace).
        assert restarted.state.board.told_end == {"p000", "p001"}
        loop.join(timeout=180)  # told everyone: it returns long before the 600 s grace
        assert outcome == ["finished"]
    finally:
        restarted.stop()
