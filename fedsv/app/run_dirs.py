"""Which run a directory names: a run directory itself, or a folder of runs (the latest by default)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedsv.ledger import LEDGER_FILE, Ledger, LedgerError


@dataclass(frozen=True)
class RunDir:
    """A run directory under a folder of runs: its path, run id, start time and rounds recorded."""

    path: Path
    run_id: str
    started_at: float
    rounds: int


def _describe(directory: Path) -> RunDir | None:
    try:
        with Ledger(directory / LEDGER_FILE, read_only=True) as ledger:
            run = ledger.run_config()
            started = ledger.run_started_at()
            rounds = len(ledger.rounds())
    except (LedgerError, OSError, ValueError):
        return None  # an unreadable ledger is not listed; `fedsv report` on it says why
    if run is None or started is None:
        return None
    return RunDir(directory, run[0], started, rounds)


def runs_under(folder: Path) -> list[RunDir]:
    """The run directories directly under `folder`, oldest first."""
    found = [_describe(child) for child in sorted(folder.iterdir()) if (child / LEDGER_FILE).is_file()]
    return sorted((run for run in found if run is not None), key=lambda run: (run.started_at, run.run_id))


def resolve_run(path: str | Path) -> tuple[Path, list[RunDir]]:
    """(the ledger file to report, the runs of the folder when `path` is a folder of runs, else []).

    A run directory (fedsv launch --out, a coordinator's --state-dir) holds ledger.sqlite; a folder of
    runs (FedSVStrategy's ledger=, one subdirectory per Flower run) gives its latest run."""
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"run directory {directory} does not exist")
    ledger = directory / LEDGER_FILE
    if ledger.is_file():
        return ledger, []
    runs = runs_under(directory)
    if not runs:
        raise ValueError(
            f"no {LEDGER_FILE} in {directory} or in its subdirectories: not a run directory (fedsv launch "
            "--out), a coordinator's --state-dir or a Flower ledger folder"
        )
    return runs[-1].path / LEDGER_FILE, runs
