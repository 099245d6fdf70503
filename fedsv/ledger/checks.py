"""Rows refused before anything is written: malformed records, values, traffic, updates, checkpoints."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedsv.ledger.checkpoint import Checkpoint
from fedsv.ledger.records import (
    ClassValueRow,
    EffectRow,
    FoldValueRow,
    RoundRecord,
    TrafficRow,
    UpdateRow,
    ValueRow,
)


class LedgerError(Exception):
    """The ledger refuses an operation (wrong run, round already recorded, bad rows, unreadable file)."""


def is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_values(n: int, received: Sequence[str], values: Sequence[ValueRow]) -> None:
    for row in values:
        reals = (row.fedsv, row.loo, row.fedsv_normalized, row.loo_normalized)
        if row.round != n or row.participant not in received:
            raise LedgerError(f"round {n}: value row {row} is not of a participant received in this round")
        if row.player and row.player not in received:
            raise LedgerError(f"round {n}: value row {row} names a player not received in this round")
        if row.alike and row.alike not in received:
            raise LedgerError(f"round {n}: value row {row} names a look-alike not received in this round")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in reals):
            raise LedgerError(f"round {n}: value row {row} holds a non-finite or non-numeric value")
        error = row.fedsv_stderr
        if not isinstance(error, (int, float)) or error < 0:  # NaN: not recorded; inf: unknown
            raise LedgerError(f"round {n}: value row {row} holds a negative or non-numeric standard error")


def check_commit(
    record: RoundRecord, values: Sequence[ValueRow], traffic: Sequence[TrafficRow], checkpoint: Checkpoint
) -> None:
    """Refuse malformed rows before any of them is written (column types are STRICT in SQLite too)."""
    n = record.round
    lists_ok = all(isinstance(p, str) for p in [*record.selected, *record.received, *record.stragglers])
    if not is_count(n) or not lists_ok:
        raise LedgerError(f"round {n!r}: the round must be an int >= 1 and participant ids str")
    if checkpoint.round != n:
        raise LedgerError(f"round {n}: the checkpoint is of round {checkpoint.round!r}")
    check_values(n, record.received, values)
    for t in traffic:
        ok = t.round == n and t.direction in ("up", "down") and isinstance(t.rpc, str) and bool(t.rpc)
        if not (ok and is_count(t.bytes) and is_count(t.messages)):
            raise LedgerError(f"round {n}: bad traffic row {t} (direction up/down, int bytes/messages >= 0)")
    if not isinstance(checkpoint.global_params, bytes) or not isinstance(checkpoint.rng_state, str):
        raise LedgerError(f"round {n}: the checkpoint needs bytes global_params and str rng_state")
    if not isinstance(checkpoint.extra, str):
        raise LedgerError(f"round {n}: the checkpoint's extra must be a JSON string")


def check_effects(record: RoundRecord, effects: Sequence[EffectRow]) -> None:
    """Each effect row of this round, of a selected participant, finite, aggregated as the record says."""
    for row in effects:
        numbers_ok = (
            all(isinstance(v, int | float) and math.isfinite(v) for v in (row.effect, row.stderr))
            and row.stderr >= 0
        )
        if (
            row.round != record.round
            or row.participant not in record.selected
            or not numbers_ok
            or bool(row.aggregated) != (row.participant in record.received)
        ):
            raise LedgerError(f"round {record.round}: bad effect row {row}")


def check_updates(record: RoundRecord, updates: Sequence[UpdateRow]) -> None:
    for row in updates:
        count_ok = (
            isinstance(row.num_samples, int)
            and not isinstance(row.num_samples, bool)
            and row.num_samples >= 1
        )
        seconds_ok = isinstance(row.train_seconds, int | float) and math.isfinite(row.train_seconds)
        if (
            row.round != record.round
            or row.participant not in record.received
            or not (count_ok and seconds_ok)
        ):
            raise LedgerError(f"round {record.round}: bad update row {row}")


def check_classes(n: int, received: Sequence[str], rows: Sequence[ClassValueRow | FoldValueRow]) -> None:
    """Values per label or fold must be of a received participant, finite, with standard errors >= 0 (NaN
    or inf: not recorded or unknown) and a fold's share in [0, 1]."""
    for row in rows:
        ok = row.round == n and row.participant in received
        if isinstance(row, FoldValueRow):
            ok = ok and isinstance(row.fold, int) and row.fold >= 0 and 0.0 <= row.share <= 1.0
            ok = ok and math.isfinite(row.fedsv) and math.isfinite(row.loo)
        else:
            ok = ok and isinstance(row.label, int) and row.label >= 0 and math.isfinite(row.fedsv)
            ok = ok and all(e >= 0 or math.isnan(e) for e in (row.stderr, row.validation))
        if not ok:
            raise LedgerError(f"round {n}: bad value row per label or fold {row}")
