"""Ledger rows for tests: a plausible round record with its value and traffic rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fedsv.ledger import Checkpoint, Ledger, RoundRecord, RoundStatus, TrafficRow, ValueRow

CONFIG = {"rounds": 10, "seed": 7, "model": "mlp", "participants": 4}


def make_record(n: int, selected: list[str] | None = None, received: list[str] | None = None) -> RoundRecord:
    selected = selected if selected is not None else ["p000", "p001", "p002"]
    received = received if received is not None else selected[:2]
    return RoundRecord(
        round=n, selected=selected, received=received, stragglers=[p for p in selected if p not in received],
        utility_before=0.1 * n, utility_after=0.1 * n + 0.05, test_accuracy=0.5 + 0.01 * n, test_loss=1.0 / n,
        status=RoundStatus.VALUED, method="exact", evaluations=2 ** len(received), valuation_seconds=0.01,
        round_seconds=1.5,
        train_wait_seconds=1.2, aggregation_seconds=0.1, evaluation_seconds=0.2, bytes_up=1000 * n,
        bytes_down=2000 * n, messages_up=3, messages_down=4, model_bytes=400, group_rationality_residual=0.0,
        started_at=1000.0 + n, finished_at=1001.5 + n,
    )  # fmt: skip


def make_rows(record: RoundRecord) -> tuple[list[ValueRow], list[TrafficRow]]:
    n = record.round
    values = [ValueRow(n, p, 0.01 * (i + 1) * n, 0.02 * i, 0.6, 0.8) for i, p in enumerate(record.received)]
    traffic = [
        TrafficRow(n, "SubmitUpdate", "up", record.bytes_up, 3),
        TrafficRow(n, "Subscribe", "down", 2000 * n, 4),
    ]
    return values, traffic


def one_round_run(
    directory: Path, participants: int, fedsv: list[float], utility: tuple[float, float] | None = None
) -> Path:
    """A run directory whose ledger holds one valued round: of `participants` members the first
    len(fedsv) selected and aggregated, valued `fedsv` exactly; `utility`: U before and after it."""
    directory.mkdir(parents=True, exist_ok=True)
    pids = [f"p{k:03d}" for k in range(len(fedsv))]
    record = make_record(1, pids, pids)
    if utility is not None:
        record = replace(record, utility_before=utility[0], utility_after=utility[1])
    with Ledger(directory / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-one-round", {"participants": participants, "rounds": 1})
        rows = [ValueRow(1, p, v, 0.0, 0.0, 0.0, 0.0) for p, v in zip(pids, fedsv, strict=True)]
        ledger.commit_round(record, rows, [], Checkpoint(1, b"w", "{}"))
    return directory
