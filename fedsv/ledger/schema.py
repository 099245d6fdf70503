"""The ledger's SQLite schema, its versions, and the migrations a coordinator applies to older files."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable

from fedsv.ledger.records import FoldValueRow, RoundRecord, RoundStatus, ValueRow

SCHEMA_VERSION = 13
"""Version 2 added the updates table (each aggregated update's sample count) and the rounds' valued_at
(when a round's values were committed: valuation may run behind the rounds). Version 3 added the
rounds' status (pending, valued, not_valued), which older files spell as the method "pending" or
"none". Version 4 added each value's standard error (round_values.fedsv_stderr) and each round's
largest (rounds.max_stderr); older rows read as not recorded (NULL), those of exact rounds as 0.
Version 5 added the values per validation label (class_values). Version 6 added each round's refused
updates with their reasons (rounds.refused), the values per validation fold (fold_values) and each
label value's validation error (class_values.validation). Version 7 added the validation scores of
other initial models (initial_scores: valuation/round/initial_spread.py). Version 8 added each update's
effect on its round's validation loss (update_effects: the guard's reputation, fedsv/fl/reputation.py).
Version 9 added the CPU seconds of each round's valuation (rounds.valuation_cpu_seconds), so that time
waiting for a CPU shows apart from valuation work; older rounds read as not measured (NULL). Version 10
added why each round was valued as it was (rounds.valuation_choice: auto's reason, how a target ended);
older rounds read as not recorded (''). Version 11 added the player each value was part of
(round_values.player: the first of the members a round valued as one player, '' for one valued alone;
valuation/accounting/owners.py); older values read as alone (''). Version 12 added whether a value's
update was public (round_values.public: aggregated with the guard's screens off, it held nothing beyond
the global model's recent steps, so every coalition held it and it was valued 0; fedsv/fl/public_steps.py);
older values read as not public (0). Version 13 added the members a value's update looked redundant
with while valued apart (round_values.alike: the first of them, '' for none; merging off, RoundValues.
alike); older values read as none ('').
A coordinator migrates an older file when it opens it (MIGRATIONS); a reader reads it as is
(round_columns)."""

STRICT = " STRICT" if sqlite3.sqlite_version_info >= (3, 37, 0) else ""
ROUND_FIELDS = [(f.name, str(f.type)) for f in dataclasses.fields(RoundRecord)]
_STATUSES = ", ".join(f"'{s.value}'" for s in RoundStatus)
_STATUS_CHECK = f"CHECK (status IN ({_STATUSES}))"
_SQL = {
    "int": "INTEGER NOT NULL",
    "float": "REAL",
    "str": "TEXT NOT NULL",
    "list[str]": "TEXT NOT NULL",
    "dict[str, str]": "TEXT NOT NULL DEFAULT '{}'",
    "RoundStatus": f"TEXT NOT NULL {_STATUS_CHECK}",
}
# STRICT tables enforce the types. REAL columns of rounds are nullable: NaN (a diverged loss) is NULL.
_ROUND_COLUMNS = ", ".join(f"{n} {_SQL[k]}" for n, k in ROUND_FIELDS).replace(
    "round INTEGER NOT NULL", "round INTEGER NOT NULL PRIMARY KEY CHECK (round >= 1)", 1
)
_UPDATES_TABLE = (
    "CREATE TABLE updates (round INTEGER NOT NULL REFERENCES rounds(round), participant TEXT NOT NULL, "
    "num_samples INTEGER NOT NULL CHECK (num_samples >= 1), train_seconds REAL NOT NULL, "
    f"PRIMARY KEY (round, participant)){STRICT}"
)
_CLASS_VALUES_TABLE = (
    "CREATE TABLE class_values (round INTEGER NOT NULL REFERENCES rounds(round), participant TEXT NOT NULL, "
    "label INTEGER NOT NULL CHECK (label >= 0), fedsv REAL NOT NULL, stderr REAL, validation REAL, "
    f"PRIMARY KEY (round, participant, label)){STRICT}"
)
_FOLD_VALUES_TABLE = (
    "CREATE TABLE fold_values (round INTEGER NOT NULL REFERENCES rounds(round), participant TEXT NOT NULL, "
    "fold INTEGER NOT NULL CHECK (fold >= 0), share REAL NOT NULL, fedsv REAL NOT NULL, loo REAL NOT NULL, "
    f"PRIMARY KEY (round, participant, fold)){STRICT}"
)
_EFFECTS_TABLE = (
    "CREATE TABLE update_effects (round INTEGER NOT NULL REFERENCES rounds(round), "
    "participant TEXT NOT NULL, effect REAL NOT NULL, stderr REAL NOT NULL, "
    "aggregated INTEGER NOT NULL CHECK (aggregated IN (0, 1)), "
    f"PRIMARY KEY (round, participant)){STRICT}"
)
_INITIAL_SCORES_TABLE = f"CREATE TABLE initial_scores (seed INTEGER PRIMARY KEY, score REAL NOT NULL){STRICT}"
CREATE = [
    f"CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL){STRICT}",
    "CREATE TABLE run (id INTEGER PRIMARY KEY CHECK (id = 1), run_id TEXT NOT NULL, config TEXT NOT NULL, "
    f"created_at REAL NOT NULL){STRICT}",
    f"CREATE TABLE rounds ({_ROUND_COLUMNS}){STRICT}",
    "CREATE TABLE round_values (round INTEGER NOT NULL REFERENCES rounds(round), participant TEXT NOT NULL, "
    "fedsv REAL NOT NULL, loo REAL NOT NULL, fedsv_normalized REAL NOT NULL, loo_normalized REAL NOT NULL, "
    "fedsv_stderr REAL, player TEXT NOT NULL DEFAULT '', "
    "public INTEGER NOT NULL DEFAULT 0 CHECK (public IN (0, 1)), alike TEXT NOT NULL DEFAULT '', "
    f"PRIMARY KEY (round, participant)){STRICT}",
    "CREATE TABLE traffic (round INTEGER NOT NULL REFERENCES rounds(round), rpc TEXT NOT NULL, "
    "direction TEXT NOT NULL CHECK (direction IN ('up', 'down')), bytes INTEGER NOT NULL, "
    f"messages INTEGER NOT NULL, PRIMARY KEY (round, rpc, direction)){STRICT}",
    # `extra` is unused: it stays, always '{}', so files of schema version 1 keep one layout.
    "CREATE TABLE checkpoint (id INTEGER PRIMARY KEY CHECK (id = 1), round INTEGER NOT NULL REFERENCES "
    f"rounds(round), global_params BLOB NOT NULL, rng_state TEXT NOT NULL, extra TEXT NOT NULL){STRICT}",
    _UPDATES_TABLE,
    _CLASS_VALUES_TABLE,
    _FOLD_VALUES_TABLE,
    _INITIAL_SCORES_TABLE,
    _EFFECTS_TABLE,
]

_STATUS_OF_METHOD = (
    f"CASE method WHEN 'pending' THEN '{RoundStatus.PENDING}' WHEN 'none' THEN '{RoundStatus.NOT_VALUED}' "
    f"ELSE '{RoundStatus.VALUED}' END"
)


def _to_2(conn: sqlite3.Connection) -> None:
    conn.execute(_UPDATES_TABLE)
    conn.execute("ALTER TABLE rounds ADD COLUMN valued_at REAL")


def _to_3(conn: sqlite3.Connection) -> None:
    conn.execute(
        f"ALTER TABLE rounds ADD COLUMN status TEXT NOT NULL DEFAULT '{RoundStatus.VALUED}' {_STATUS_CHECK}"
    )
    conn.execute(f"UPDATE rounds SET status = {_STATUS_OF_METHOD}")
    conn.execute("UPDATE rounds SET method = '' WHERE method = 'pending'")


def _to_4(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE round_values ADD COLUMN fedsv_stderr REAL")
    conn.execute("ALTER TABLE rounds ADD COLUMN max_stderr REAL")
    exact = "SELECT round FROM rounds WHERE method = 'exact'"
    conn.execute(f"UPDATE round_values SET fedsv_stderr = 0 WHERE round IN ({exact})")
    conn.execute("UPDATE rounds SET max_stderr = 0 WHERE method = 'exact'")


def _to_5(conn: sqlite3.Connection) -> None:
    conn.execute(_CLASS_VALUES_TABLE.replace(" validation REAL,", ""))


def _to_6(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE rounds ADD COLUMN refused TEXT NOT NULL DEFAULT '{}'")
    conn.execute("ALTER TABLE class_values ADD COLUMN validation REAL")
    conn.execute(_FOLD_VALUES_TABLE)


def _to_7(conn: sqlite3.Connection) -> None:
    conn.execute(_INITIAL_SCORES_TABLE)


def _to_8(conn: sqlite3.Connection) -> None:
    conn.execute(_EFFECTS_TABLE)


def _to_9(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE rounds ADD COLUMN valuation_cpu_seconds REAL")


def _to_10(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE rounds ADD COLUMN valuation_choice TEXT NOT NULL DEFAULT ''")


def _to_11(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE round_values ADD COLUMN player TEXT NOT NULL DEFAULT ''")


def _to_12(conn: sqlite3.Connection) -> None:
    conn.execute(
        "ALTER TABLE round_values ADD COLUMN public INTEGER NOT NULL DEFAULT 0 CHECK (public IN (0, 1))"
    )


def _to_13(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE round_values ADD COLUMN alike TEXT NOT NULL DEFAULT ''")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _to_2,
    2: _to_3,
    3: _to_4,
    4: _to_5,
    5: _to_6,
    6: _to_7,
    7: _to_8,
    8: _to_9,
    9: _to_10,
    10: _to_11,
    11: _to_12,
    12: _to_13,
}
"""version -> the step that brings a file of that version to the next."""


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a file of `version` to SCHEMA_VERSION, inside the caller's transaction."""
    for step in range(version, SCHEMA_VERSION):
        MIGRATIONS[step](conn)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def round_columns(version: int) -> str:
    """The SELECT list of RoundRecord's fields for a file of `version` (older files read as they are)."""
    stand_ins = {}
    if version < 2:
        stand_ins["valued_at"] = "NULL"
    if version < 4:
        stand_ins["max_stderr"] = "CASE method WHEN 'exact' THEN 0.0 END"
    if version < 6:
        stand_ins["refused"] = "'{}'"
    if version < 9:
        stand_ins["valuation_cpu_seconds"] = "NULL"
    if version < 10:
        stand_ins["valuation_choice"] = "''"
    if version < 3:
        stand_ins["status"] = _STATUS_OF_METHOD
        stand_ins["method"] = "CASE method WHEN 'pending' THEN '' ELSE method END"
    return ", ".join(stand_ins.get(name, name) for name, _ in ROUND_FIELDS)


VALUE_FIELDS = [f.name for f in dataclasses.fields(ValueRow)]
FOLD_FIELDS = [f.name for f in dataclasses.fields(FoldValueRow)]


def value_columns(version: int) -> str:
    """The SELECT list of ValueRow's fields for a file of `version`."""
    stand_ins = {}
    if version < 4:
        stand_ins["fedsv_stderr"] = (
            "CASE WHEN round IN (SELECT round FROM rounds WHERE method = 'exact') THEN 0.0 END"
        )
    if version < 11:
        stand_ins["player"] = "''"
    if version < 12:
        stand_ins["public"] = "0"
    if version < 13:
        stand_ins["alike"] = "''"
    return ", ".join(stand_ins.get(name, name) for name in VALUE_FIELDS)


def value_insert() -> str:
    """INSERT of a ValueRow's fields by name."""
    return (
        f"INSERT INTO round_values ({', '.join(VALUE_FIELDS)}) VALUES ({', '.join('?' * len(VALUE_FIELDS))})"
    )


def round_insert() -> str:
    """INSERT of a RoundRecord's fields by name (a migrated file's columns are in another order)."""
    names = [name for name, _ in ROUND_FIELDS]
    return f"INSERT INTO rounds ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
