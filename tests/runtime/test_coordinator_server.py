"""A TLS coordinator started in-process on port 0: gRPC health service, metrics endpoint, clean stop."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from fedsv.coordinator.server import SERVICE_NAME, Coordinator
from fedsv.coordinator.server_config import ServerConfig
from fedsv.security import certs
from fedsv.security.tls import channel_credentials
from fedsv.settings.run import RunConfig
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc


def test_health_and_metrics_are_served_and_stop_cleanly(tmp_path: Path) -> None:
    run = RunConfig(participants=2, rounds=1, epochs=1, validation_size=100)
    certs.generate(tmp_path / "certs", 2)
    server = ServerConfig(
        state_dir=str(tmp_path),
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        health_port=0,
        join_timeout=1.0,
        tls_dir=str(tmp_path / "certs"),
    )
    registry = CollectorRegistry()
    coordinator = Coordinator(run, server, registry=registry)
    coordinator.start()
    try:
        assert coordinator.port > 0 and coordinator.metrics_port > 0 and coordinator.health_port > 0
        credentials, _ = channel_credentials(tmp_path / "certs", 0)
        # Health on the TLS port (for a participant) and on the plaintext health port (for probes).
        for channel in (
            grpc.secure_channel(f"127.0.0.1:{coordinator.port}", credentials),
            grpc.insecure_channel(f"127.0.0.1:{coordinator.health_port}"),
        ):
            with channel:
                stub = health_pb2_grpc.HealthStub(channel)
                for service in ("", SERVICE_NAME):
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{coordinator.metrics_port}/metrics", timeout=10
        ).read()
        assert b"fedsv_current_round" in text and b"fedsv_participants_connected" in text
        # Nobody joins: the run stops after join_timeout instead of hanging.
        result: list[str] = []
        thread = threading.Thread(target=lambda: result.append(str(coordinator.run())))
        thread.start()
        thread.join(timeout=30)
        assert result == ["stopped: participants did not join in time"]
    finally:
        coordinator.stop()
    assert (tmp_path / "ledger.sqlite").exists()
    # Stopped means the metrics socket is closed too, so the port can be listened on again at once.
    # SO_REUSEADDR lets the bind past the scrape's TIME_WAIT, never past a socket still listening.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", coordinator.metrics_port))
        probe.listen()


def test_stop_ends_hundreds_of_open_task_streams(tmp_path: Path) -> None:
    """100 participants with 2 task streams each: stop() cancels them all (their generators close
    their calls) and returns; the streams end at the clients."""
    run = RunConfig(participants=100, rounds=1, epochs=1, validation_size=100)
    server = ServerConfig(
        state_dir=str(tmp_path), host="127.0.0.1", port=0, metrics_port=-1, health_port=-1, insecure=True
    )
    coordinator = Coordinator(run, server, registry=CollectorRegistry())
    coordinator.start()
    streams = []
    stopper: threading.Thread | None = None
    with grpc.insecure_channel(f"127.0.0.1:{coordinator.port}") as channel:
        stub = fedsv_pb2_grpc.CoordinatorStub(channel)
        try:
            for rank in range(100):
                reply = stub.Join(
                    fedsv_pb2.JoinRequest(rank=rank, world_size=100, num_samples=10), timeout=30
                )
                request = fedsv_pb2.SubscribeRequest(
                    participant_id=reply.participant_id, session_token=reply.session_token
                )
                streams += [stub.Subscribe(request), stub.Subscribe(request)]
            deadline = time.time() + 60
            while sum(coordinator.state.sessions.open_calls.values()) < 200:
                assert time.time() < deadline, "the 200 streams never reached the coordinator"
                time.sleep(0.05)
            assert coordinator.state.sessions.connected() == 100
            stopper = threading.Thread(target=coordinator.stop)
            stopper.start()
            stopper.join(timeout=60)
            assert not stopper.is_alive(), "stop() did not return"
        finally:
            if stopper is None:
                coordinator.stop()
        assert coordinator.state.sessions.connected() == 0 and not any(
            coordinator.state.sessions.open_calls.values()
        )
        for events in streams[:3]:
            with pytest.raises(grpc.RpcError):
                next(events)
