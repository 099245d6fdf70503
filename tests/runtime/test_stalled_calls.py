"""Calls whose request never arrives: they hold no slot anyone else needs, and they end at the deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry

from fedsv.coordinator.server import Coordinator
from fedsv.coordinator.server_config import ServerConfig
from fedsv.participant.host import run_alone
from fedsv.participant.worker import RankWorker
from fedsv.settings.run import RunConfig

pytestmark = pytest.mark.slow

METHODS = {
    "/fedsv.v1.Coordinator/Join": "stream_unary",
    "/fedsv.v1.Coordinator/Subscribe": "stream_stream",
    "/grpc.health.v1.Health/Check": "stream_unary",
}


def _config(tmp_path: Path, header_timeout: float) -> ServerConfig:
    return ServerConfig(
        state_dir=str(tmp_path / "state"), host="127.0.0.1", port=0, metrics_port=-1, health_port=0,
        join_timeout=120.0, linger=0.0, insecure=True, header_timeout=header_timeout,
    )  # fmt: skip


def _stall(channel: grpc.Channel, method: str, hold: threading.Event) -> grpc.Future:
    """A call of a unary-request method whose request never comes: the client opens the stream and
    waits (a client-streaming call on the wire is the same HTTP/2 stream as a unary one)."""

    def nothing() -> Iterator[bytes]:
        hold.wait()
        yield from ()

    if METHODS[method] == "stream_unary":
        return channel.stream_unary(method).future(nothing(), timeout=600)
    call = channel.stream_stream(method)(nothing(), timeout=600)
    return call


def _health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        return int(check(health_pb2.HealthCheckRequest(service=""), timeout=30).status)


def test_3n_plus_64_stalled_calls_do_not_stop_a_run(tmp_path: Path) -> None:
    """The old server-wide cap was 3N + 64 calls; that many stalled Join, Subscribe and health calls
    (and more) are held open through the whole run, which finishes every round, while both health
    ports answer SERVING."""
    participants = 2
    run = RunConfig(participants=participants, fraction=1.0, rounds=2, epochs=1, validation_size=100)
    coordinator = Coordinator(run, _config(tmp_path, header_timeout=600.0), registry=CollectorRegistry())
    coordinator.start()
    hold = threading.Event()
    # two connections: one holds at most 2N + 64 streams (the server's per-connection bound)
    local = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(f"127.0.0.1:{coordinator.port}", options=local) for _ in range(2)]
    try:
        stalled = 3 * participants + 64 + 16
        methods = list(METHODS)
        calls = [_stall(channels[i % 2], methods[i % len(methods)], hold) for i in range(stalled)]
        deadline = time.time() + 120
        while coordinator.servers.awaiting_requests() < stalled:  # every one reached the server
            assert time.time() < deadline, (
                f"{coordinator.servers.awaiting_requests()} of {stalled} calls arrived"
            )
            time.sleep(0.05)
        assert _health(coordinator.port) == health_pb2.HealthCheckResponse.SERVING
        assert _health(coordinator.health_port) == health_pb2.HealthCheckResponse.SERVING
        target = f"127.0.0.1:{coordinator.port}"
        workers = [RankWorker(target, r, participants, give_up_after=120) for r in range(participants)]
        results: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda w=w: results.update({w.rank: str(run_alone(w))})) for w in workers
        ]
        for thread in threads:
            thread.start()
        assert str(coordinator.run()) == "finished"
        for thread in threads:
            thread.join(timeout=120)
        assert results == {0: "finished", 1: "finished"}
        assert [r.round for r in coordinator.ledger.rounds()] == [1, 2]
        assert not any(call.done() for call in calls)  # held through the whole run
    finally:
        hold.set()
        for channel in channels:
            channel.close()
        coordinator.stop()


def test_a_call_whose_request_never_comes_ends_at_the_deadline(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    run = RunConfig(participants=2, fraction=1.0, rounds=1, epochs=1, validation_size=100)
    coordinator = Coordinator(run, _config(tmp_path, header_timeout=1.0), registry=registry)
    coordinator.start()
    hold = threading.Event()
    channel = grpc.insecure_channel(f"127.0.0.1:{coordinator.port}")
    try:
        for method in METHODS:
            call = _stall(channel, method, hold)
            with pytest.raises(grpc.RpcError) as info:
                if METHODS[method] == "stream_unary":
                    call.result(timeout=120)
                else:
                    next(iter(call))
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, method
            assert "no request within 1 s" in (info.value.details() or "")
        timed_out = registry.get_sample_value("fedsv_updates_rejected_total", {"reason": "request_timeout"})
        assert timed_out == len(METHODS)
    finally:
        hold.set()
        channel.close()
        coordinator.stop()
