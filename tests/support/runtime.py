"""Shared helpers of the runtime tests: process command lines, starting and stopping, ledgers, metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fedsv.ledger import Ledger
from tests.support.processes import wait_for

# The end-to-end tests' run: 6 participants, 3 per round, 2 rounds.
SMALL: dict[str, object] = {
    "participants": 6,
    "fraction": 0.5,
    "rounds": 2,
    "epochs": 1,
    "validation_size": 200,
    "seed": 3,
}
# The fault and hostile-input tests' run: 4 participants, 3 drawn per round (so the selection RNG
# matters on a resume), 4 rounds, exact values. `reference_run` (conftest.py) runs it undisturbed.
FAULT_RUN: dict[str, object] = {
    "participants": 4,
    "fraction": 0.75,
    "rounds": 4,
    "epochs": 1,
    "validation_size": 200,
    "seed": 3,
    "valuation": "exact",
}
START_TIMEOUT = 180.0  # seconds for a coordinator to serve (torch import + data on a busy machine)


def flags(settings: Mapping[str, object]) -> list[str]:
    """--key value for each setting (underscores become dashes; a boolean is --key or --no-key)."""
    out: list[str] = []
    for key, value in settings.items():
        name = key.replace("_", "-")
        out += (
            [f"--{name}" if value else f"--no-{name}"]
            if isinstance(value, bool)
            else [f"--{name}", str(value)]
        )
    return out


# How an in-process coordinator (ServerConfig) secures gRPC; keep in step with transport_flags.
TRANSPORT_SETTINGS: dict[str, object] = {"insecure": True}


def transport_flags(role: str) -> list[str]:
    """How a coordinator or participant process secures its gRPC traffic: THE one place to change it.

    The tests here are about faults and hostile input, not transport security: plaintext on loopback
    (or between network namespaces). For TLS return ["--tls-dir", DIR] with DIR from `fedsv certs`.
    """
    assert role in ("coordinator", "participant"), role
    return ["--insecure"]


def coordinator_argv(state: Path, settings: Mapping[str, object], port: int = 0) -> list[str]:
    """`python -m fedsv.coordinator` for a run of `settings` (RunConfig, ServerConfig fields) in `state`."""
    server = {
        "state_dir": state,
        "host": "127.0.0.1",
        "port": port,
        "metrics_port": 0,
        "health_port": -1,  # the plaintext health port: the tests ask the gRPC port itself
        "port_file": state / "coordinator.port",
        "log_level": "INFO",
        **settings,
    }
    return [sys.executable, "-m", "fedsv.coordinator", *flags(server), *transport_flags("coordinator")]


def participant_argv(target: str, ranks: str | None, world_size: int, *extra: str) -> list[str]:
    """`python -m fedsv.participant` playing `ranks` (None: from mpirun & co.) of a run against `target`."""
    settings: dict[str, object] = {"coordinator": target, "world_size": world_size, "log_level": "INFO"}
    if ranks is not None:
        settings["ranks"] = ranks
    command = [sys.executable, "-m", "fedsv.participant", *flags(settings), *extra]
    return [*command, *transport_flags("participant")]


def fault_client_argv(target: str, rank: int, world_size: int, chunks: int, ready: Path) -> list[str]:
    """tests/fault_client.py: plays `rank` until its update stream has sent `chunks` chunks, then stalls."""
    settings = {"coordinator": target, "rank": rank, "world_size": world_size}
    settings.update(chunks=chunks, ready=ready)
    script = Path(__file__).with_name("fault_client.py")
    return [sys.executable, str(script), *flags(settings), *transport_flags("participant")]


def spawn(argv: Sequence[str], log: Path, netns: str | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` (in network namespace `netns`, if given) with stdout and stderr appended to `log`."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([*prefix, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)


def start_coordinator(
    state: Path, settings: Mapping[str, object], port: int = 0, netns: str | None = None
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start a coordinator and wait until it serves; returns (process, gRPC port, metrics port)."""
    state.mkdir(parents=True, exist_ok=True)
    port_file = state / "coordinator.port"
    port_file.unlink(missing_ok=True)
    log = state / "coordinator.log"
    proc = spawn(coordinator_argv(state, settings, port), log, netns)
    try:
        wait_for(lambda: port_file.exists() or proc.poll() is not None, START_TIMEOUT, "the coordinator")
    except AssertionError:
        stop(proc)
        raise
    assert proc.poll() is None, f"coordinator exited with {proc.returncode}: {tail(log)}"
    grpc_port, metrics_port = (int(v) for v in port_file.read_text().split())
    return proc, grpc_port, metrics_port


def start_participants(
    target: str, ranks: str, world_size: int, log: Path, *extra: str, netns: str | None = None
) -> subprocess.Popen[bytes]:
    return spawn(participant_argv(target, ranks, world_size, *extra), log, netns)


def stop(*procs: subprocess.Popen[Any] | None) -> None:
    """SIGKILL whichever of `procs` still run (stopped ones too) and reap them."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} does not exist)"


def launch(
    out: Path, settings: Mapping[str, object], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`fedsv launch` of a run of `settings` into `out` (two participant processes)."""
    return subprocess.run(
        [sys.executable, "-m", "fedsv", "launch", *flags(settings), "--out", str(out), "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def rounds_in(state: Path) -> list[int]:
    if not (state / "ledger.sqlite").exists():
        return []
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        return [r.round for r in ledger.rounds()]


def all_valued(state: Path) -> bool:
    """True once the ledger has rounds and none still waits for its values (the backlog is done)."""
    if not (state / "ledger.sqlite").exists():
        return False
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        return bool(ledger.rounds()) and not ledger.pending_rounds()


def ledger_digest(run_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What two runs of the same seed must agree on: rounds, values and traffic."""
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


def check_ledger(state: Path) -> list[int]:
    """Assert the ledger is sound wherever a run stopped; returns its rounds.

    SQLite's integrity check passes, rounds are 1..k each exactly once, each round's value rows are
    exactly its received participants, stragglers are the selected that were not received, and the
    checkpoint is of round k.
    """
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        assert ledger.integrity_ok()
        rounds = ledger.rounds()
        numbers = [r.round for r in rounds]
        assert numbers == list(range(1, len(rounds) + 1)), numbers
        valued: dict[int, list[str]] = {}
        for row in ledger.values():
            valued.setdefault(row.round, []).append(row.participant)
        pending = ledger.pending_rounds()
        # Values are committed in round order, behind the rounds: pending rounds are the last ones, have
        # no values yet, and their valuation inputs wait on disk.
        assert pending == numbers[len(numbers) - len(pending) :], (pending, numbers)
        for r in rounds:
            if r.pending:
                assert r.round not in valued and (state / "pending" / f"round-{r.round:06d}.pt").is_file()
                continue
            assert sorted(valued.get(r.round, [])) == r.received, (r.round, valued.get(r.round), r.received)
            assert r.stragglers == [p for p in r.selected if p not in r.received]
        checkpoint = ledger.last_checkpoint()
        assert (checkpoint.round if checkpoint else 0) == len(rounds)
    return numbers


def scrape(port: int, host: str = "127.0.0.1") -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The coordinator's Prometheus samples: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)
