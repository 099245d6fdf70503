"""A TLS coordinator started in-process on port 0: gRPC health service, metrics endpoint, clean stop."""

from __future__ import annotations

import socket
import threading
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from fedsv.common import certs
from fedsv.common.tls import channel_credentials
from fedsv.coordinator.config import RunConfig, ServerConfig
from fedsv.coordinator.server import SERVICE_NAME, Coordinator


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
        thread = threading.Thread(target=lambda: result.append(coordinator.run()))
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
