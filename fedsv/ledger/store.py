"""The run's durable ledger: one SQLite file with every round, its values and traffic, and the checkpoint."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from fedsv.ledger import schema
from fedsv.ledger.checkpoint import Checkpoint
from fedsv.ledger.checks import (
    LedgerError,
    check_classes,
    check_commit,
    check_effects,
    check_updates,
    check_values,
)
from fedsv.ledger.connection import LedgerFile
from fedsv.ledger.records import (
    ClassValueRow,
    EffectRow,
    FoldValueRow,
    RoundRecord,
    RoundStatus,
    TrafficRow,
    UpdateRow,
    ValuationSummary,
    ValueRow,
)

logger = logging.getLogger(__name__)

LEDGER_FILE = "ledger.sqlite"
"""A run directory's ledger (fedsv launch --out, a coordinator's --state-dir, a Flower run's folder)."""

__all__ = ["Ledger", "LedgerError"]


SplitRow = ClassValueRow | FoldValueRow
"""A round value split by validation label or by validation fold."""


def _value_row(row: ValueRow | SplitRow) -> tuple[Any, ...]:
    """A value row as SQL parameters: a NaN (not recorded) is NULL."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in dataclasses.astuple(row))


class Ledger(LedgerFile):
    """One run's ledger: its rounds, values, traffic and checkpoint, written in one transaction a round
    (LedgerFile: WAL mode, one writer thread; readers open their own read_only=True)."""

    def ensure_run(self, run_id: str, config: dict[str, Any]) -> None:
        """Record the run on its first start; on a resume, refuse another run id or config."""
        self._writable()
        new = json.loads(json.dumps(config, sort_keys=True))
        with self._transaction() as conn:
            row = conn.execute("SELECT run_id, config FROM run WHERE id = 1").fetchone()
            if row is None:
                conn.execute("INSERT INTO run VALUES (1, ?, ?, ?)", (run_id, json.dumps(new), time.time()))
                logger.info("ledger %s: started run %s", self.path, run_id)
                return
            old, gone = json.loads(row[1]), "<absent>"
            diff = [
                f"{key} ({old.get(key, gone)!r} in the ledger, {new.get(key, gone)!r} now)"
                for key in sorted(set(old) | set(new))
                if old.get(key, gone) != new.get(key, gone)
            ]
            if diff or row[0] != run_id:
                raise LedgerError(
                    f"{self.path} holds run {row[0]}, not {run_id}; config keys that differ: "
                    f"{'; '.join(diff) or 'none (only the run id)'}. Resume with the original settings "
                    "or use a new state directory."
                )
        logger.info("ledger %s: resuming run %s", self.path, run_id)

    def run_config(self) -> tuple[str, dict[str, Any]] | None:
        """(run id, config) as first recorded; None before ensure_run."""
        rows = self._query("SELECT run_id, config FROM run WHERE id = 1")
        return (rows[0][0], json.loads(rows[0][1])) if rows else None

    def run_started_at(self) -> float | None:
        """When the run was first recorded (seconds since the epoch); None before ensure_run."""
        rows = self._query("SELECT created_at FROM run WHERE id = 1")
        return float(rows[0][0]) if rows else None

    def record_initial_scores(self, scores: dict[int, float]) -> None:
        """Record the validation scores of other initial models, seed -> score, once: a file that holds
        some keeps them (a resumed run keeps the scores it started with)."""
        self._writable()
        with self._transaction() as conn:
            if conn.execute("SELECT COUNT(*) FROM initial_scores").fetchone()[0] == 0:
                conn.executemany("INSERT INTO initial_scores VALUES (?, ?)", sorted(scores.items()))

    def initial_scores(self) -> list[float]:
        """The validation scores of other initial models, by seed (none before schema 7)."""
        if self._version < 7:
            return []
        return [float(r[0]) for r in self._query("SELECT score FROM initial_scores ORDER BY seed")]

    def commit_round(
        self,
        record: RoundRecord,
        values: Sequence[ValueRow],
        traffic: Sequence[TrafficRow],
        checkpoint: Checkpoint,
        updates: Sequence[UpdateRow] = (),
        classes: Sequence[SplitRow] = (),
        effects: Sequence[EffectRow] = (),
    ) -> None:
        """Write the round, its values (and values per label) and traffic and the checkpoint in ONE
        transaction: all or nothing.

        Rounds are numbered 1, 2, ... without gaps; a round already recorded raises LedgerError and
        changes nothing. Malformed rows raise LedgerError before anything is written.
        """
        self._writable()
        check_commit(record, values, traffic, checkpoint)
        check_updates(record, updates)
        check_effects(record, effects)
        check_classes(record.round, record.received, classes)
        row = [
            json.dumps(v)
            if isinstance(v, list | dict)
            else None
            if isinstance(v, float) and math.isnan(v)
            else v
            for v in (getattr(record, n) for n, _ in schema.ROUND_FIELDS)
        ]
        try:
            with self._transaction() as conn:
                last = conn.execute("SELECT coalesce(max(round), 0) FROM rounds").fetchone()[0]
                if record.round <= last:
                    raise LedgerError(f"round {record.round} already recorded (last round {last})")
                if record.round != last + 1:
                    raise LedgerError(f"round {record.round} does not follow the last recorded round {last}")
                conn.execute(schema.round_insert(), row)
                conn.executemany(schema.value_insert(), map(_value_row, values))
                conn.executemany(
                    "INSERT INTO traffic VALUES (?, ?, ?, ?, ?)", map(dataclasses.astuple, traffic)
                )
                conn.executemany("INSERT INTO updates VALUES (?, ?, ?, ?)", map(dataclasses.astuple, updates))
                self._insert_classes(conn, classes)
                conn.executemany(
                    "INSERT INTO update_effects VALUES (?, ?, ?, ?, ?)",
                    [(e.round, e.participant, e.effect, e.stderr, int(e.aggregated)) for e in effects],
                )
                self._save_checkpoint(conn, checkpoint)
        except sqlite3.Error as exc:
            raise LedgerError(f"round {record.round} not recorded: {exc}") from exc
        logger.debug("ledger %s: committed round %d", self.path, record.round)

    def _save_checkpoint(self, conn: sqlite3.Connection, checkpoint: Checkpoint) -> None:
        """Replace the one checkpoint row: the last write of a round's transaction."""
        conn.execute(
            "INSERT OR REPLACE INTO checkpoint VALUES (1, ?, ?, ?, ?)",
            (checkpoint.round, checkpoint.global_params, checkpoint.rng_state, checkpoint.extra),
        )

    def last_checkpoint(self) -> Checkpoint | None:
        rows = self._query("SELECT round, global_params, rng_state, extra FROM checkpoint WHERE id = 1")
        return Checkpoint(rows[0][0], bytes(rows[0][1]), rows[0][2], rows[0][3]) if rows else None

    def rounds(self) -> list[RoundRecord]:
        return self._records("")

    def round_record(self, number: int) -> RoundRecord:
        """One round's record; LedgerError if the ledger has none."""
        records = self._records(f"WHERE round = {int(number)}")
        if not records:
            raise LedgerError(f"{self.path}: no round {number}")
        return records[0]

    def _records(self, where: str) -> list[RoundRecord]:
        out = []
        for row in self._query(
            f"SELECT {schema.round_columns(self._version)} FROM rounds {where} ORDER BY round"
        ):
            kw: dict[str, Any] = {
                n: json.loads(v) if k in ("list[str]", "dict[str, str]") else (math.nan if v is None else v)
                for (n, k), v in zip(schema.ROUND_FIELDS, row, strict=True)
            }
            kw["status"] = RoundStatus(kw["status"])
            out.append(RoundRecord(**kw))
        return out

    def values(self) -> list[ValueRow]:
        """Value rows by round; within a round in the order committed (the round's participant order)."""
        rows = self._query(
            f"SELECT {schema.value_columns(self._version)} FROM round_values ORDER BY round, rowid"
        )
        return [
            ValueRow(
                r[0], r[1], r[2], r[3], r[4], r[5], math.nan if r[6] is None else r[6], r[7], bool(r[8]), r[9]
            )
            for r in rows
        ]

    @staticmethod
    def _insert_classes(conn: sqlite3.Connection, rows: Sequence[SplitRow]) -> None:
        labels = [_value_row(r) for r in rows if isinstance(r, ClassValueRow)]
        folds = [_value_row(r) for r in rows if isinstance(r, FoldValueRow)]
        conn.executemany("INSERT INTO class_values VALUES (?, ?, ?, ?, ?, ?)", labels)
        names = ", ".join(schema.FOLD_FIELDS)
        conn.executemany(f"INSERT INTO fold_values ({names}) VALUES (?, ?, ?, ?, ?, ?)", folds)

    def class_values(self) -> list[ClassValueRow]:
        """Every value per label, by round, participant and label (none in files before schema 5)."""
        if self._version < 5:
            return []
        validation = "validation" if self._version >= 6 else "NULL"
        rows = self._query(
            f"SELECT round, participant, label, fedsv, stderr, {validation} FROM class_values "
            "ORDER BY round, participant, label"
        )
        return [ClassValueRow(*r[:4], *(math.nan if v is None else v for v in r[4:])) for r in rows]

    def fold_values(self) -> list[FoldValueRow]:
        """Every value per validation fold, by round, participant and fold (none before schema 6)."""
        if self._version < 6:
            return []
        names = ", ".join(schema.FOLD_FIELDS)
        rows = self._query(f"SELECT {names} FROM fold_values ORDER BY round, participant, fold")
        return [FoldValueRow(*r) for r in rows]

    def commit_values(
        self,
        number: int,
        values: Sequence[ValueRow],
        summary: ValuationSummary,
        classes: Sequence[SplitRow] = (),
    ) -> None:
        """Record a pending round's values and its valuation fields, in one transaction.

        Rounds are valued in order: the round must be the first one still pending. Value rows must
        be of participants received in that round.
        """
        self._writable()
        try:
            with self._transaction() as conn:
                pending = (RoundStatus.PENDING.value,)
                first = conn.execute("SELECT min(round) FROM rounds WHERE status = ?", pending).fetchone()[0]
                if first != number:
                    raise LedgerError(f"round {number} is not the first round awaiting values ({first})")
                (received,) = conn.execute(
                    "SELECT received FROM rounds WHERE round = ?", (number,)
                ).fetchone()
                check_values(number, json.loads(received), values)
                fields = dataclasses.asdict(summary)
                assignments = ", ".join(f"{name} = ?" for name in fields)
                conn.execute(
                    f"UPDATE rounds SET {assignments} WHERE round = ?",
                    [None if isinstance(v, float) and math.isnan(v) else v for v in fields.values()]
                    + [number],
                )
                conn.executemany(schema.value_insert(), map(_value_row, values))
                check_classes(number, json.loads(received), classes)
                self._insert_classes(conn, classes)
        except sqlite3.Error as exc:
            raise LedgerError(f"values of round {number} not recorded: {exc}") from exc

    def pending_rounds(self) -> list[int]:
        """Rounds committed whose values are not yet (the background valuation's backlog), in order."""
        status = "CASE method WHEN 'pending' THEN 'pending' END" if self._version < 3 else "status"
        return [
            r[0] for r in self._query(f"SELECT round FROM rounds WHERE {status} = 'pending' ORDER BY round")
        ]

    def updates(self) -> list[UpdateRow]:
        """Every aggregated update's declared sample count, by round and participant."""
        if self._version < 2:
            return []
        return [UpdateRow(*r) for r in self._query("SELECT * FROM updates ORDER BY round, participant")]

    def effects(self) -> list[EffectRow]:
        """Every update's effect on its round's validation loss, by round and participant (none before
        schema 8)."""
        if self._version < 8:
            return []
        rows = self._query("SELECT * FROM update_effects ORDER BY round, participant")
        return [EffectRow(r, p, e, s, bool(a)) for r, p, e, s, a in rows]

    def traffic(self) -> list[TrafficRow]:
        return [TrafficRow(*r) for r in self._query("SELECT * FROM traffic ORDER BY round, rpc, direction")]

    def integrity_ok(self) -> bool:
        """SQLite's integrity check, no orphan value/traffic rows, and the checkpoint is of the last round."""
        orphans = "SELECT count(*) = 0 FROM {} WHERE round NOT IN (SELECT round FROM rounds)"
        checks = {
            "integrity_check": "PRAGMA integrity_check",
            "orphan values": orphans.format("round_values"),
            "orphan traffic": orphans.format("traffic"),
            "orphan values per label": orphans.format("class_values") if self._version >= 5 else "SELECT 1",
            "orphan values per fold": orphans.format("fold_values") if self._version >= 6 else "SELECT 1",
            "orphan effects": orphans.format("update_effects") if self._version >= 8 else "SELECT 1",
            "checkpoint of the last round": "SELECT (SELECT max(round) FROM rounds) IS "
            "(SELECT round FROM checkpoint WHERE id = 1)",
        }
        failed = [name for name, sql in checks.items() if self._query(sql) not in ([("ok",)], [(1,)], [])]
        if failed:
            logger.warning("ledger %s failed checks: %s", self.path, ", ".join(failed))
        return not failed
