"""`fedsv launch`: a coordinator and participant processes on loopback (like mpirun), with progress."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field, model_validator

from fedsv.config.checks import MAX_SECONDS
from fedsv.fl.device import resolve_device
from fedsv.fl.ranks import block_of
from fedsv.ledger import LEDGER_FILE, Ledger, RoundRecord
from fedsv.security import certs
from fedsv.settings import process_settings as ps  # the settings' declarations
from fedsv.settings.model import ConfigModel
from fedsv.settings.run import RunConfig
from fedsv.settings.schema import DECLARED, changed
from fedsv.valuation.accounting.rounds import valuation_time

logger = logging.getLogger(__name__)


class LaunchError(Exception):
    """The run's processes could not be started; the message is one line for the user."""


class LaunchConfig(ConfigModel):
    """How `fedsv launch` places the run on this machine."""

    out: ps.out = DECLARED
    data: ps.data = DECLARED
    processes: ps.processes = DECLARED
    threads: ps.threads = DECLARED
    round_timeout: ps.round_timeout = DECLARED
    metrics_port: ps.metrics_port = changed(
        ps.metrics_port, 0, why="an ephemeral port, so that runs on one machine never collide"
    )
    timeout: float = Field(
        default=3600.0,
        description="give up on the whole run after this many seconds",
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    )
    linger: ps.linger = DECLARED
    valuation_schedule: ps.valuation_schedule = DECLARED
    device: ps.device = DECLARED
    insecure: ps.insecure = DECLARED

    @model_validator(mode="after")
    def _check_launch(self) -> LaunchConfig:
        """A device that exists."""
        if self.device:
            try:
                resolve_device(self.device)
            except ValueError as exc:
                raise ValueError(f"device: {exc}") from None
        return self


def last_error(path: Path) -> str:
    """The line of a log that best says why a process ended: the last "error:" line or the last line
    of a traceback (the exception), else the last line; cut to 300 characters."""
    if not path.exists():
        return f"(no log at {path})"
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if not lines:
        return "(empty log)"
    for line in reversed(lines):
        if "error:" in line.lower() or re.match(r"^[A-Za-z_.]+(Error|Exception)\b", line):
            return line[:300]
    return lines[-1][:300]


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / max(1, total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def format_stderr(stderr: float) -> str:
    """A standard error for people: "exact" for 0, "unknown" where it is not known or not recorded."""
    if stderr == 0:
        return "exact"
    return "unknown" if not math.isfinite(stderr) else f"max stderr {stderr:.4f}"


def format_progress(record: RoundRecord, total_rounds: int) -> str:
    return (
        f"round {record.round:3d}/{total_rounds} {_bar(record.round, total_rounds)} "
        f"acc {record.test_accuracy:.3f}  U {record.utility_before:.3f}->{record.utility_after:.3f}  "
        f"received {len(record.received)}/{len(record.selected)}  "
        f"valuation {record.method}: {record.evaluations} evals, {format_stderr(record.max_stderr)}, "
        f"{valuation_time(record.valuation_seconds, record.valuation_cpu_seconds)}  "
        f"round {record.round_seconds:.1f}s"
    )


def format_backlog(records: list[RoundRecord], total_rounds: int) -> str | None:
    """Once every round is trained and some still wait for their values, the line that says so."""
    pending = [r.round for r in records if r.pending]
    if len(records) < total_rounds or not pending:
        return None
    left = len(pending)
    return f"all {total_rounds} rounds trained; valuing the backlog: {left} rounds (from round {pending[0]})"


class Launch:
    """Starts the processes of one run and follows it through the ledger."""

    def __init__(self, run: RunConfig, launch: LaunchConfig, log_level: str = "WARNING") -> None:
        self.run, self.launch, self.log_level = run, launch, log_level
        self.out = Path(launch.out)
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.participants: list[subprocess.Popen[bytes]] = []

    def threads_per_process(self) -> int:
        """Torch threads of each process this launch starts: the processes share one machine, and
        more compute threads than cores make every parallel region spin (tens of times slower)."""
        if self.launch.threads > 0:
            return self.launch.threads
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, cpus // (self.participant_processes() + 1))

    def participant_processes(self) -> int:
        return min(self.launch.processes or min(self.run.participants, 4), self.run.participants)

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if "OMP_NUM_THREADS" not in os.environ:
            threads = str(self.threads_per_process())
            env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        with open(self.out / log_name, "ab") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env)

    def _transport(self) -> tuple[dict[str, object], list[str]]:
        """The coordinator's settings and the participants' flags for TLS (certificates made once)."""
        if self.launch.insecure:
            return {"insecure": True}, ["--insecure"]
        tls_dir = self.out / "certs"
        if not certs.complete(tls_dir, self.run.participants):
            certs.generate(tls_dir, self.run.participants)
            logger.info("certificates for %d participants in %s", self.run.participants, tls_dir)
        return {"tls_dir": str(tls_dir)}, ["--tls-dir", str(tls_dir)]

    def start(self) -> tuple[int, int]:
        """Start the coordinator, then (once it serves) the participants; returns (grpc, metrics) ports."""
        self.out.mkdir(parents=True, exist_ok=True)
        transport, participant_flags = self._transport()
        port_file = self.out / "coordinator.port"
        port_file.unlink(missing_ok=True)
        config = {
            **self.run.settings(),  # every setting: a record's omissions would read as today's defaults
            "state_dir": str(self.out),
            "host": "127.0.0.1",
            "port": 0,
            "metrics_port": self.launch.metrics_port,
            "port_file": str(port_file),
            "round_timeout": self.launch.round_timeout,
            "linger": self.launch.linger,
            "valuation_schedule": self.launch.valuation_schedule,
            **({"valuation_device": self.launch.device} if self.launch.device else {}),
            "health_port": -1,
            **transport,
        }
        (self.out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        argv = ["-m", "fedsv.coordinator", "--config", str(self.out / "config.json")]
        self.coordinator = self._spawn([*argv, "--log-level", self.log_level], "coordinator.log")
        deadline = time.time() + 120
        while not port_file.exists():
            if self.coordinator.poll() is not None:
                why = last_error(self.out / "coordinator.log")
                raise LaunchError(f"coordinator exited with {self.coordinator.returncode}: {why}")
            if time.time() > deadline:
                raise LaunchError("coordinator did not start serving within 120 s")
            time.sleep(0.05)
        grpc_port, metrics_port = (int(v) for v in port_file.read_text().split())
        if self._recorded_rounds() >= self.run.rounds:
            logger.info("%s holds the finished run: no participants needed", self.out)
            return grpc_port, metrics_port
        n = self.run.participants
        processes = self.participant_processes()
        for index in range(processes):
            ranks = block_of(index, processes, n)
            self.participants.append(
                self._spawn(
                    [
                        "-m",
                        "fedsv.participant",
                        "--coordinator",
                        f"127.0.0.1:{grpc_port}",
                        "--world-size",
                        str(n),
                        "--ranks",
                        f"{ranks[0]}-{ranks[-1]}",
                        "--log-level",
                        self.log_level,
                        *(["--device", self.launch.device] if self.launch.device else []),
                        *self._data_flags(),
                        *participant_flags,
                    ],
                    f"participants-{index}.log",
                )
            )
        return grpc_port, metrics_port

    def _data_flags(self) -> list[str]:
        """The participants' --task, --data (a per-rank template) and --data-dir, where set."""
        flags = {"--task": self.run.task, "--data": self.launch.data, "--data-dir": self.run.data_dir}
        return [item for flag, value in flags.items() if value.strip() for item in (flag, value)]

    def _recorded_rounds(self) -> int:
        ledger_path = self.out / LEDGER_FILE
        if not ledger_path.exists():
            return 0
        with Ledger(ledger_path, read_only=True) as ledger:
            return len(ledger.rounds())

    def _check_participants(self, reported: set[int], printer: Callable[[str], object]) -> bool:
        """Report each participant process that died (once, with its log's last error line); True
        while at least one is alive or ended cleanly."""
        for index, proc in enumerate(self.participants):
            code = proc.poll()
            if code not in (None, 0) and index not in reported:
                reported.add(index)
                line = last_error(self.out / f"participants-{index}.log")
                printer(f"participant process {index} exited with code {code}: {line}")
        return len(reported) < len(self.participants)

    def follow(
        self, printer: Callable[[str], object] = print, on_valued: Callable[[], object] | None = None
    ) -> int:
        """Print a progress line per completed round until the coordinator exits; returns its exit code.
        `on_valued` is called each time rounds got their values (report.html is rewritten then).

        A participant process that dies is reported within a second, with its last error line; when
        none is left, the run is stopped (LaunchError) instead of waiting for round deadlines.
        """
        assert self.coordinator is not None
        shown = 0
        backlog_shown = False
        dead: set[int] = set()
        deadline = time.time() + self.launch.timeout
        ledger_path = self.out / LEDGER_FILE
        while True:
            exited = self.coordinator.poll() is not None
            if ledger_path.exists():
                with Ledger(ledger_path, read_only=True) as ledger:
                    records = ledger.rounds()
                before = shown
                for record in records:  # a round's line once it has its values
                    if record.round > shown and not record.pending:
                        printer(format_progress(record, self.run.rounds))
                        shown = record.round
                if shown > before and on_valued is not None:
                    on_valued()
                backlog = None if backlog_shown else format_backlog(records, self.run.rounds)
                if backlog is not None:
                    printer(backlog)
                    backlog_shown = True
            if exited:
                break
            if self.participants and not self._check_participants(dead, printer):
                self.coordinator.terminate()
                self.coordinator.wait(timeout=30)
                raise LaunchError(f"every participant process exited with an error; see {self.out}")
            if time.time() > deadline:
                logger.error("run exceeded %.0f s; stopping it", self.launch.timeout)
                self.coordinator.terminate()
            time.sleep(0.25)
        # Participants leave on the run's end message; one that missed it (it connected after the
        # coordinator had gone, e.g. when a finished run is launched again) is stopped, not waited for.
        grace = time.time() + 10
        for proc in self.participants:
            try:
                proc.wait(timeout=max(0.1, grace - time.time()))
            except subprocess.TimeoutExpired:
                proc.terminate()
        return int(self.coordinator.returncode)

    def stop(self) -> None:
        for proc in [*self.participants, *([self.coordinator] if self.coordinator else [])]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.participants, *([self.coordinator] if self.coordinator else [])]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
