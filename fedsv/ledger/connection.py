"""The ledger's SQLite file: opened in WAL mode, its schema checked, created or migrated; transactions."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from fedsv.ledger import schema
from fedsv.ledger.checks import LedgerError

logger = logging.getLogger(__name__)

# FULL: in WAL mode every COMMIT fsyncs the WAL, so a round already reported (metrics, progress) also
# survives power loss; NORMAL survives only a process crash, and a re-run of a lost round could pay
# differently (other stragglers). The cost, one fsync per round, is noise next to a round.
SYNCHRONOUS = "FULL"


class LedgerFile:
    """One ledger file at `path` in WAL mode: one writer thread; readers open their own read_only=True."""

    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._empty = False
        self._version = schema.SCHEMA_VERSION  # of the file: older ones are read as they are
        if read_only and not self.path.is_file():
            raise LedgerError(f"no ledger at {self.path}")
        target = f"{self.path.resolve().as_uri()}?mode=ro" if read_only else str(self.path)
        try:  # isolation_level=None: transactions are explicit (BEGIN ... COMMIT under _lock)
            self._conn = sqlite3.connect(
                target, uri=read_only, timeout=10.0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: cannot open the ledger: {exc}") from exc
        try:
            if read_only:
                self._conn.execute("PRAGMA query_only = ON")
            self._check_file()
            if not read_only:
                mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise LedgerError(f"{self.path}: could not switch to WAL journal mode (got {mode})")
                self._conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
                self._conn.execute("PRAGMA foreign_keys = ON")
            self._open_schema()
        except (sqlite3.Error, LedgerError) as exc:
            self._conn.close()
            if isinstance(exc, LedgerError):
                raise
            raise LedgerError(f"{self.path}: cannot open the ledger: {exc}") from exc

    def _check_file(self) -> None:
        """Refuse, before anything is written to it, a file that is not SQLite, a SQLite file that is
        not a fedsv ledger, and a damaged ledger (SQLite's integrity check)."""
        tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "meta" not in tables:
            raise LedgerError(f"{self.path}: not a fedsv ledger (tables {sorted(tables)})")
        if not tables:
            return
        try:
            problems = [str(r[0]) for r in self._conn.execute("PRAGMA integrity_check(3)")]
        except sqlite3.DatabaseError as exc:
            problems = [str(exc)]
        if problems != ["ok"]:
            found = "; ".join(line.strip(" *") for line in problems[0].splitlines() if line.strip(" *"))
            raise LedgerError(f"{self.path}: the ledger is damaged ({found[:200]}); restore it from a backup")

    def _open_schema(self) -> None:
        """Check the schema version; create the schema in a new file, migrate an older one (a writer);
        a reader sees an empty ledger in a file without a schema yet."""
        with self._transaction(write=not self.read_only) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            self._empty = not tables and self.read_only
            if "meta" in tables:
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                known = [str(v) for v in range(1, schema.SCHEMA_VERSION + 1)]
                if row is None or row[0] not in known:
                    found = row[0] if row else "?"
                    raise LedgerError(f"{self.path}: schema {found}; this fedsv reads {', '.join(known)}")
                self._version = int(row[0])
                if self._version < schema.SCHEMA_VERSION and not self.read_only:
                    schema.migrate(conn, self._version)
                    logger.info("ledger %s: schema %d -> %d", self.path, self._version, schema.SCHEMA_VERSION)
                    self._version = schema.SCHEMA_VERSION
            elif tables:
                raise LedgerError(f"{self.path}: not a fedsv ledger (tables {sorted(tables)})")
            elif not self.read_only:
                for statement in schema.CREATE:
                    conn.execute(statement)
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(schema.SCHEMA_VERSION),))
                logger.info("created ledger %s (schema %d)", self.path, schema.SCHEMA_VERSION)

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE (a write) or BEGIN (a consistent read) ... COMMIT; ROLLBACK on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _writable(self) -> None:
        if self.read_only:
            raise LedgerError(f"{self.path}: opened read-only")

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        if self._empty:  # a reader opened before the coordinator created the schema: look again
            self._open_schema()
            if self._empty:
                return []
        with self._transaction(write=False) as conn:
            return conn.execute(sql).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
