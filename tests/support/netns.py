"""Separate hosts for tests: a coordinator network namespace joined to host namespaces by veth pairs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.support.processes import need_tool


@dataclass(frozen=True)
class Link:
    """A veth pair from the coordinator's namespace to a participant host's, in a /30 of its own."""

    host: str  # participant namespace
    coordinator_dev: str
    host_dev: str
    coordinator_ip: str
    host_ip: str


@dataclass(frozen=True)
class Hosts:
    coordinator: str
    links: tuple[Link, ...]


def ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, f"ip {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def need_netns() -> None:
    """Skip unless this process may create network namespaces (root, iproute2)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    need_tool("ip", "apt-get install iproute2")


@contextmanager
def make_hosts(names: Sequence[str]) -> Iterator[Hosts]:
    """Namespace `coord` and one per name, veths on 10.200.K.(4i)/30; all deleted afterwards."""
    need_netns()
    tag = os.getpid() % 100_000
    subnet = 10 + os.getpid() % 240
    coordinator = f"fedsv{tag}-coord"
    created: list[str] = []
    try:
        ip("netns", "add", coordinator)
        created.append(coordinator)
        ip("-n", coordinator, "link", "set", "lo", "up")
        links = []
        for i, name in enumerate(names):
            link = Link(
                host=f"fedsv{tag}-{name}",
                coordinator_dev=f"fv{tag}c{i}",
                host_dev=f"fv{tag}h{i}",
                coordinator_ip=f"10.200.{subnet}.{4 * i + 1}",
                host_ip=f"10.200.{subnet}.{4 * i + 2}",
            )
            ip("netns", "add", link.host)
            created.append(link.host)
            ip("-n", link.host, "link", "set", "lo", "up")
            # Both ends are created inside the namespaces: nothing is added to this machine's own network.
            ip("link", "add", link.coordinator_dev, "netns", coordinator, "type", "veth",
               "peer", "name", link.host_dev, "netns", link.host)  # fmt: skip
            for ns, dev, address in (
                (coordinator, link.coordinator_dev, link.coordinator_ip),
                (link.host, link.host_dev, link.host_ip),
            ):
                ip("-n", ns, "addr", "add", f"{address}/30", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
            links.append(link)
        yield Hosts(coordinator, tuple(links))
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
