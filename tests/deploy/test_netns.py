"""Separate hosts: coordinator and participants in their own network namespaces, joined by veth pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsv.ledger import Ledger
from fedsv.security import certs
from tests.support.netns import Hosts, ip, make_hosts
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow

CREDENTIAL = "netns-test-secret"
GRPC_PORT, METRICS_PORT = 50051, 9090


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    """Namespaces coordinator, hostb, hostc; veths on 10.200.K.0/30 and 10.200.K.4/30; deleted afterwards."""
    with make_hosts(("hostb", "hostc")) as made:
        yield made


def _in(ns: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT)


def _python_in(ns: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _flags(settings: dict[str, object]) -> list[str]:
    return [part for key, value in settings.items() for part in (f"--{key}", str(value))]


def _veth_bytes(ns: str, dev: str) -> int:
    (stats,) = json.loads(ip("-n", ns, "-j", "-s", "link", "show", "dev", dev))
    return int(stats["stats64"]["rx"]["bytes"]) + int(stats["stats64"]["tx"]["bytes"])


def test_coordinator_and_participants_on_separate_hosts_complete_a_run(hosts: Hosts, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    log = state / "coordinator.log"
    # Mutual TLS as docs/deployment.md shows: the coordinator's certificate names the addresses
    # participants dial (one per veth); each participant host presents its ranks' certificates.
    tls_dir = tmp_path / "certs"
    certs.generate(tls_dir, 4, hosts=[link.coordinator_ip for link in hosts.links])
    settings = {
        "participants": 4, "fraction": 0.5, "rounds": 2, "epochs": 1, "validation-size": 200, "seed": 5,
        "valuation": "exact", "state-dir": state, "host": "0.0.0.0", "port": GRPC_PORT,
        "metrics-port": METRICS_PORT, "credential": CREDENTIAL, "log-level": "INFO", "tls-dir": tls_dir,
    }  # fmt: skip
    coordinator = _in(hosts.coordinator, [sys.executable, "-m", "fedsv.coordinator", *_flags(settings)], log)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        wait_for(
            lambda: "serving gRPC" in log.read_text() or coordinator.poll() is not None,
            120,
            "the coordinator",
        )
        assert coordinator.poll() is None, log.read_text()[-2000:]
        first = hosts.links[0]
        # From host B the coordinator is reachable only over the veth: its own loopback has nothing there.
        probe = _python_in(
            first.host,
            "import socket, sys, urllib.request\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {GRPC_PORT}), timeout=2)\n"
            "    sys.exit('the coordinator answered on host B loopback')\n"
            "except ConnectionRefusedError:\n"
            "    pass\n"
            f"url = 'http://{first.coordinator_ip}:{METRICS_PORT}/metrics'\n"
            "print(urllib.request.urlopen(url, timeout=10).read().decode())\n",
        )
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert "fedsv_current_round" in probe.stdout
        before = sum(_veth_bytes(hosts.coordinator, link.coordinator_dev) for link in hosts.links)
        for link, ranks in zip(hosts.links, ("0-1", "2-3"), strict=True):
            flags = _flags(
                {
                    "coordinator": f"{link.coordinator_ip}:{GRPC_PORT}",
                    "world-size": 4,
                    "ranks": ranks,
                    "credential": CREDENTIAL,
                    "log-level": "INFO",
                    "tls-dir": tls_dir,
                }
            )
            argv = [sys.executable, "-m", "fedsv.participant", *flags]
            workers.append(_in(link.host, argv, tmp_path / f"{link.host}.log"))
        assert coordinator.wait(timeout=240) == 0, log.read_text()[-2000:]
        for link, worker in zip(hosts.links, workers, strict=True):
            assert worker.wait(timeout=60) == 0, (tmp_path / f"{link.host}.log").read_text()[-2000:]
    finally:
        for proc in (coordinator, *workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    text = log.read_text()
    assert all(f"rank {r} joined" in text for r in range(4)) and "mutual TLS" in text
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
        traffic = sum(row.bytes for row in ledger.traffic())
    assert [r.round for r in rounds] == [1, 2]
    assert all(r.received == r.selected for r in rounds)
    # Every byte the ledger counted crossed the veths (plus TCP/IP and HTTP/2 framing).
    crossed = sum(_veth_bytes(hosts.coordinator, link.coordinator_dev) for link in hosts.links) - before
    assert crossed >= traffic > 0
