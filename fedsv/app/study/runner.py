"""Runs a study's training runs through `fedsv launch` (real coordinator + participants), a few at a time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from fedsv.app.launch import Launch, LaunchConfig, LaunchError
from fedsv.app.report_files import write_outputs
from fedsv.app.study.config import cpu_count
from fedsv.fl.ranks import participant_id
from fedsv.ledger import (
    LEDGER_FILE,
    Ledger,
    LedgerError,
    RoundRecord,
    ValueRow,
    decode_params,
    drew_balanced,
    federated_valuation,
)
from fedsv.settings.run import UNGUARDED, RunConfig
from fedsv.valuation import FederatedValuation

logger = logging.getLogger(__name__)


class StudyError(Exception):
    """A study cannot go on (a run failed, bad input); its message is one line for the user."""


@dataclass(frozen=True)
class RunResult:
    """What a finished run left in its ledger."""

    directory: Path
    rounds: list[RoundRecord]
    values: list[ValueRow]
    seconds: float  # wall time of the launch; 0.0 when an earlier identical run was reused

    @property
    def final_accuracy(self) -> float:
        return float(self.rounds[-1].test_accuracy)

    @property
    def valuation_seconds(self) -> float:
        """Seconds the run's rounds spent computing their values (in the valuation process)."""
        return float(sum(record.valuation_seconds for record in self.rounds))

    @property
    def evaluations(self) -> int:
        """Utility evaluations (coalitions scored) over the run's rounds."""
        return int(sum(record.evaluations for record in self.rounds))

    def valuation(self) -> FederatedValuation:
        """The run's per-round values, as recorded in its ledger (with their values per validation fold,
        over every participant of the run), so its values and errors are the run's report's."""
        with Ledger(self.directory / LEDGER_FILE, read_only=True) as ledger:
            folds, run, initial = ledger.fold_values(), ledger.run_config(), ledger.initial_scores()
        count = None if run is None else run[1].get("participants")
        world = [participant_id(r) for r in range(count)] if isinstance(count, int) else None
        balanced = run is not None and drew_balanced(run[1])
        return federated_valuation(self.rounds, self.values, world, (), folds, initial, balanced)

    def selection(self) -> dict[int, list[str]]:
        """round -> participant ids selected in it."""
        return {record.round: list(record.selected) for record in self.rounds}

    def final_params(self) -> dict[str, Tensor]:
        """The global model after the last round (the ledger's checkpoint)."""
        with Ledger(self.directory / LEDGER_FILE, read_only=True) as ledger:
            checkpoint = ledger.last_checkpoint()
        if checkpoint is None:
            raise StudyError(f"{self.directory}: the ledger holds no checkpoint")
        return decode_params(checkpoint.global_params)


@dataclass(frozen=True)
class Recorded:
    """What `directory`'s ledger holds of this very run (same settings), finished or not."""

    rounds: list[RoundRecord]
    values: list[ValueRow]
    total: int  # the rounds the run has in all

    @property
    def pending(self) -> int:
        """Committed rounds whose values are still to come."""
        return sum(record.pending for record in self.rounds)

    @property
    def finished(self) -> bool:
        """Every round trained and valued: what a study may reuse."""
        return len(self.rounds) >= self.total and not self.pending


def _recorded(directory: Path, run: RunConfig) -> Recorded | None:
    """This very run as `directory`'s ledger records it; None when there is none, or another run's."""
    path = directory / LEDGER_FILE
    if not path.is_file():
        return None
    try:
        with Ledger(path, read_only=True) as ledger:
            recorded = ledger.run_config()
            rounds, values = ledger.rounds(), ledger.values()
    except LedgerError:
        return None
    if recorded is None or _as_recorded(recorded[1]) != run.to_dict():
        return None
    return Recorded(rounds, values, run.rounds)


def _finished(directory: Path, run: RunConfig) -> RunResult | None:
    """The run recorded in `directory` if it is this very run and finished, every round valued."""
    recorded = _recorded(directory, run)
    if recorded is None or not recorded.finished:
        return None
    return RunResult(directory, recorded.rounds, recorded.values, 0.0)


def _as_recorded(recorded: dict[str, Any]) -> dict[str, Any] | None:
    """A recorded run config with the settings it predates at their defaults (None if unreadable); a
    run recorded before the update guard existed ran without it (UNGUARDED)."""
    try:
        return RunConfig.from_record({**UNGUARDED, **recorded}).to_dict()
    except (TypeError, ValueError):
        return None


def _clear(directory: Path, keep_ledger: bool = False) -> None:
    """Remove what a different earlier run left, so the new one starts afresh; with `keep_ledger`, only
    the logs and the port file, so the coordinator resumes this run from its ledger."""
    names = ["coordinator.port"]
    if not keep_ledger:
        names += [LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm"]
    for name in names:
        (directory / name).unlink(missing_ok=True)
    for log in directory.glob("*.log"):
        log.unlink()


def _last_line(exc: Exception) -> str:
    """Launch's "coordinator exited with 1: <log lines joined by ' | '>" cut to the log's last line."""
    text = str(exc)
    if " | " not in text:
        return text
    return f"{text.split(':', 1)[0]}: {text.rsplit(' | ', 1)[-1].strip()}"


class Runner:
    """Launches runs (each a coordinator and participant processes on loopback), `jobs` at a time.

    Each run's processes get an equal share of the CPUs (torch threads), so `jobs` runs at once do not
    oversubscribe the machine; every finished run gets its report.json (and values.csv, figures).
    """

    def __init__(
        self,
        jobs: int,
        processes: int,
        timeout: float,
        report: Callable[[str], None] = print,
        device: str = "",
    ) -> None:
        self.jobs, self.processes, self.timeout, self.report = jobs, processes, timeout, report
        self.device = device
        self._lock = threading.Lock()
        self.launched = 0
        self.reused = 0
        self.launch_seconds = 0.0
        self._active: set[Launch] = set()

    def run(self, run: RunConfig, directory: Path, label: str) -> RunResult:
        """One run into `directory`; an identical finished run already there is reused, not re-run, and
        an identical unfinished one (stopped mid-training, or before its backlog was valued) resumes
        from its ledger: nothing it recorded is trained or valued again."""
        before = _recorded(directory, run)
        if before is not None and before.finished:
            with self._lock:
                self.reused += 1
            self.report(f"  {label}: reusing the finished run in {directory}")
            if not (directory / "report.json").is_file():
                write_outputs(directory)
            return RunResult(directory, before.rounds, before.values, 0.0)
        directory.mkdir(parents=True, exist_ok=True)
        if before is None:
            _clear(directory)
        else:
            self.report(
                f"  {label}: resuming the unfinished run in {directory} ({len(before.rounds)} of "
                f"{run.rounds} rounds trained, {before.pending} awaiting values)"
            )
            _clear(directory, keep_ledger=True)
        processes = min(self.processes, run.participants)
        launch_config = LaunchConfig(
            out=str(directory),
            processes=processes,
            threads=max(1, cpu_count() // (self.jobs * (processes + 1))),
            metrics_port=-1,
            linger=0.0,
            timeout=self.timeout,
            device=self.device,
        )
        launch = Launch(run, launch_config)
        started = time.time()
        with self._lock:
            self._active.add(launch)
        try:
            launch.start()
            code = launch.follow(lambda line: self.report(f"  {label}: {line.strip()}"))
        except LaunchError as exc:
            raise StudyError(f"{label}: the run in {directory} did not start: {_last_line(exc)}") from exc
        finally:
            launch.stop()
            with self._lock:
                self._active.discard(launch)
        seconds = time.time() - started
        result = _finished(directory, run)
        if code != 0 or result is None:
            raise StudyError(
                f"{label}: the run in {directory} failed (coordinator exit code {code}); "
                f"see {directory}/coordinator.log"
                + ("" if before is None else "; remove that directory to run it afresh instead of resuming")
            )
        result = RunResult(result.directory, result.rounds, result.values, seconds)
        write_outputs(directory)
        with self._lock:
            self.launched += 1
            self.launch_seconds += seconds
        self.report(
            f"  {label}: done in {seconds:.1f} s, final test accuracy {result.final_accuracy:.4f}, "
            f"valuation {result.evaluations} evals in {result.valuation_seconds:.1f} s; "
            f"{directory / 'report.json'}"
        )
        return result

    def run_many(self, items: Sequence[tuple[RunConfig, Path, str]]) -> list[RunResult]:
        """Several runs, `jobs` at once; results in the order given. The first failure stops the rest."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = [pool.submit(self.run, run, directory, label) for run, directory, label in items]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                with self._lock:
                    active = list(self._active)
                for launch in active:  # Ctrl-C or a failed run: end the runs still going
                    launch.stop()
                raise
