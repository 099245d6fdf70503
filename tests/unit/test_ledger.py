"""The SQLite ledger: round trips, one transaction per round, refusals, read-only readers, SIGKILL safety."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fedsv.ledger import (
    Checkpoint,
    EffectRow,
    Ledger,
    LedgerError,
    RoundRecord,
    RoundStatus,
    TrafficRow,
    UpdateRow,
    ValueRow,
)
from fedsv.ledger.schema import SCHEMA_VERSION
from tests.support.records import CONFIG, make_record, make_rows

REPO = Path(__file__).resolve().parents[2]


def commit(ledger: Ledger, n: int, blob: bytes = b"params") -> RoundRecord:
    record = make_record(n)
    values, traffic = make_rows(record)
    ledger.commit_round(record, values, traffic, Checkpoint(n, blob + bytes([n]), json.dumps({"n": n})))
    return record


def snapshot(ledger: Ledger) -> tuple[Any, ...]:
    return ledger.rounds(), ledger.values(), ledger.traffic(), ledger.last_checkpoint(), ledger.run_config()


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger(tmp_path / "ledger.sqlite") as opened:
        opened.ensure_run("run-1", CONFIG)
        yield opened


def test_round_trip(ledger: Ledger) -> None:
    assert ledger.last_checkpoint() is None and ledger.rounds() == []
    records = [commit(ledger, n) for n in (1, 2, 3)]
    assert ledger.rounds() == records
    assert ledger.round_record(2) == records[1]
    with pytest.raises(LedgerError, match="no round 4"):
        ledger.round_record(4)
    assert ledger.values() == [v for r in records for v in make_rows(r)[0]]
    assert ledger.traffic() == [t for r in records for t in make_rows(r)[1]]
    assert ledger.last_checkpoint() == Checkpoint(3, b"params\x03", '{"n": 3}')  # only the latest
    assert ledger.run_config() == ("run-1", CONFIG)
    assert ledger.integrity_ok()
    assert records[0].physical_minimum_bytes == 400 * 5 and records[0].bytes_ratio_to_minimum == 3000 / 2000


def test_nan_floats_of_a_round_survive(ledger: Ledger) -> None:
    record = make_record(1)
    record = RoundRecord(**{**record.__dict__, "test_loss": math.nan})
    ledger.commit_round(record, [], [], Checkpoint(1, b"", "{}"))
    assert math.isnan(ledger.rounds()[0].test_loss)


def test_a_round_is_never_recorded_twice(ledger: Ledger) -> None:
    commit(ledger, 1)
    commit(ledger, 2)
    before = snapshot(ledger)
    with pytest.raises(LedgerError, match="already recorded"):
        commit(ledger, 2, blob=b"other")
    with pytest.raises(LedgerError, match="already recorded"):
        commit(ledger, 1)
    with pytest.raises(LedgerError, match="does not follow"):
        commit(ledger, 4)
    assert snapshot(ledger) == before


def test_resume_with_another_config_is_refused(tmp_path: Path, ledger: Ledger) -> None:
    commit(ledger, 1)
    ledger.ensure_run("run-1", dict(CONFIG))  # the same run resumes
    with pytest.raises(
        LedgerError, match=r"rounds \(10 in the ledger, 20 now\).*seed \(7 in the ledger, 8 now\)"
    ):
        ledger.ensure_run("run-2", {**CONFIG, "rounds": 20, "seed": 8})
    with pytest.raises(LedgerError, match="extra"):
        ledger.ensure_run("run-1", {**CONFIG, "extra": True})
    assert ledger.run_config() == ("run-1", CONFIG)


def test_wal_journal_and_full_sync(ledger: Ledger) -> None:
    with sqlite3.connect(ledger.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_read_only_reader_sees_commits(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with pytest.raises(LedgerError, match="no ledger"):
        Ledger(path, read_only=True)
    path.touch()  # the coordinator created the file but not the schema yet
    with Ledger(path, read_only=True) as reader:
        assert reader.rounds() == [] and reader.run_config() is None and reader.integrity_ok()
        with Ledger(path) as writer:
            writer.ensure_run("run-1", CONFIG)
            first = commit(writer, 1)
            assert reader.rounds() == [first] and reader.run_config() == ("run-1", CONFIG)
            second = commit(writer, 2)
            assert reader.rounds() == [first, second] and reader.last_checkpoint().round == 2  # type: ignore[union-attr]
        with pytest.raises(LedgerError, match="read-only"):
            commit(reader, 3)
        with pytest.raises(LedgerError, match="read-only"):
            reader.ensure_run("run-1", CONFIG)
        assert reader.integrity_ok()


def test_a_failed_commit_leaves_nothing_of_its_round(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(ledger, 1)
    before = snapshot(ledger)
    record = make_record(2)
    values, traffic = make_rows(record)
    checkpoint = Checkpoint(2, b"p", "{}")
    # a constraint fails inside the transaction, after the round row was inserted
    with pytest.raises(LedgerError, match="not recorded"):
        ledger.commit_round(record, [*values, values[0]], traffic, checkpoint)
    assert snapshot(ledger) == before
    # malformed rows are refused before anything is written
    bad = [ValueRow(2, "p000", "high", 0.0, 0.0, 0.0)]  # type: ignore[arg-type]
    for rows, match in ((bad, "non-numeric"), ([ValueRow(2, "p000", math.nan, 0, 0, 0)], "non-finite"),
                        ([ValueRow(2, "p002", 0, 0, 0, 0)], "not of a participant received")):  # fmt: skip
        with pytest.raises(LedgerError, match=match):
            ledger.commit_round(record, rows, traffic, checkpoint)
    with pytest.raises(LedgerError, match="checkpoint is of round 1"):
        ledger.commit_round(record, values, traffic, Checkpoint(1, b"p", "{}"))
    with pytest.raises(LedgerError, match="bad traffic row"):
        ledger.commit_round(record, values, [TrafficRow(2, "Join", "sideways", 1, 1)], checkpoint)

    # the process "crashes" while writing the checkpoint, the last write of the transaction
    def boom(*args: object) -> None:
        raise RuntimeError("crash while writing the checkpoint")

    monkeypatch.setattr(Ledger, "_save_checkpoint", boom)
    with pytest.raises(RuntimeError, match="crash"):
        ledger.commit_round(record, values, traffic, checkpoint)
    assert snapshot(ledger) == before and ledger.integrity_ok()
    monkeypatch.undo()
    ledger.commit_round(record, values, traffic, checkpoint)  # the round can then be recorded once
    assert [r.round for r in ledger.rounds()] == [1, 2] and ledger.integrity_ok()


def test_integrity_ok_detects_orphans_and_stale_checkpoint(ledger: Ledger) -> None:
    commit(ledger, 1)
    commit(ledger, 2)
    assert ledger.integrity_ok()
    with sqlite3.connect(ledger.path) as raw:  # foreign keys are off on this raw connection
        raw.execute("UPDATE checkpoint SET round = 1")
    assert not ledger.integrity_ok()
    with sqlite3.connect(ledger.path) as raw:
        raw.execute("UPDATE checkpoint SET round = 2")
        raw.execute("INSERT INTO traffic VALUES (9, 'Join', 'up', 1, 1)")
    assert not ledger.integrity_ok()


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as raw:
        raw.execute("CREATE TABLE t (x)")
    with pytest.raises(LedgerError, match="not a fedsv ledger"):
        Ledger(other)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(LedgerError, match="cannot open"):
        Ledger(garbage, read_only=True)
    with Ledger(tmp_path / "l.sqlite"):
        pass
    with sqlite3.connect(tmp_path / "l.sqlite") as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema 99"):
        Ledger(tmp_path / "l.sqlite")


def test_update_rows_record_each_aggregated_count(ledger: Ledger) -> None:
    record = make_record(1)
    values, traffic = make_rows(record)
    updates = [UpdateRow(1, pid, 10 * (i + 1), 0.5) for i, pid in enumerate(record.received)]
    ledger.commit_round(record, values, traffic, Checkpoint(1, b"p", "{}"), updates)
    assert ledger.updates() == updates
    bad = make_record(2)
    values, traffic = make_rows(bad)
    for row in (
        UpdateRow(2, "p009", 5, 0.1),
        UpdateRow(2, "p000", 0, 0.1),
        UpdateRow(2, "p000", 5, math.inf),
    ):
        with pytest.raises(LedgerError, match="bad update row"):
            ledger.commit_round(bad, values, traffic, Checkpoint(2, b"p", "{}"), [row])
    assert [r.round for r in ledger.rounds()] == [1]


def test_update_effects_are_kept_with_their_round_and_checked(ledger: Ledger) -> None:
    """The guard's evidence: every update's effect on the round's validation loss, aggregated or not
    (p002 was selected, not aggregated: quarantined)."""
    record = make_record(1)
    values, traffic = make_rows(record)
    effects = [EffectRow(1, "p000", -0.01, 0.002, True), EffectRow(1, "p002", 0.3, 0.01, False)]
    ledger.commit_round(record, values, traffic, Checkpoint(1, b"p", "{}"), effects=effects)
    assert ledger.effects() == effects and ledger.integrity_ok()
    bad_record = make_record(2)
    bad_values, bad_traffic = make_rows(bad_record)
    for row in (
        EffectRow(2, "p009", 0.1, 0.01, False),  # not selected
        EffectRow(2, "p000", math.nan, 0.01, True),
        EffectRow(2, "p000", 0.1, -1.0, True),
        EffectRow(2, "p002", 0.1, 0.01, True),  # not aggregated, yet said to be
        EffectRow(3, "p000", 0.1, 0.01, True),
    ):
        with pytest.raises(LedgerError, match="bad effect row"):
            ledger.commit_round(bad_record, bad_values, bad_traffic, Checkpoint(2, b"p", "{}"), effects=[row])
    assert [r.round for r in ledger.rounds()] == [1]


def test_a_schema_7_ledger_reads_no_effects_and_migrates(tmp_path: Path) -> None:
    path = _older_ledger(tmp_path, 7)
    with Ledger(path, read_only=True) as reader:
        assert reader.effects() == [] and reader.integrity_ok()
    with Ledger(path) as ledger:
        record = make_record(2)
        values, traffic = make_rows(record)
        effect = EffectRow(2, "p001", 0.0, 0.0, True)
        ledger.commit_round(record, values, traffic, Checkpoint(2, b"p", "{}"), effects=[effect])
        assert ledger.effects() == [effect]


NOT_RECORDED_BEFORE: dict[
    int, tuple[str, Any]
] = {  # the rounds' columns a schema version added: how an older round reads them
    8: ("valuation_cpu_seconds", 1.5),  # NaN: not measured
    9: (
        "valuation_choice",
        "regression to 0.5 of each value's validation noise; reached after 300 evaluations",
    ),
}


@pytest.mark.parametrize("version", sorted(NOT_RECORDED_BEFORE))
def test_a_ledger_from_before_a_rounds_column_reads_it_as_not_recorded_and_migrates(
    tmp_path: Path, version: int
) -> None:
    field, recorded = NOT_RECORDED_BEFORE[version]
    path = _older_ledger(tmp_path, version)
    with Ledger(path, read_only=True) as reader:
        older = getattr(reader.rounds()[0], field)
        assert (older == "") if isinstance(recorded, str) else math.isnan(older)
        assert reader.integrity_ok()
    with Ledger(path) as ledger:
        record = dataclasses.replace(make_record(2), **{field: recorded})
        values, traffic = make_rows(record)
        ledger.commit_round(record, values, traffic, Checkpoint(2, b"p", "{}"))
        assert getattr(ledger.rounds()[1], field) == recorded


def test_a_schema_11_ledger_reads_no_value_as_public_and_migrates(tmp_path: Path) -> None:
    path = _older_ledger(tmp_path, 11)
    with Ledger(path, read_only=True) as reader:
        assert {row.public for row in reader.values()} == {False} and reader.integrity_ok()
    with Ledger(path) as ledger:
        record = make_record(2)
        values, traffic = make_rows(record)
        public = [dataclasses.replace(values[0], public=True), *values[1:]]
        ledger.commit_round(record, public, traffic, Checkpoint(2, b"p", "{}"))
        assert [bool(row.public) for row in ledger.values() if row.round == 2] == [True] + [False] * (
            len(values) - 1
        )


LINK_BEFORE = {10: ("player", "names a player"), 12: ("alike", "names a look-alike")}
"""The value rows' links a schema version added (the first member of the row's merged player; of its
look-alike group): an older row reads as linked to none."""


@pytest.mark.parametrize("version", sorted(LINK_BEFORE))
def test_a_ledger_from_before_a_link_reads_every_value_unlinked_and_migrates(
    tmp_path: Path, version: int
) -> None:
    column, refusal = LINK_BEFORE[version]
    path = _older_ledger(tmp_path, version)
    with Ledger(path, read_only=True) as reader:
        assert {getattr(row, column) for row in reader.values()} == {""} and reader.integrity_ok()
    with Ledger(path) as ledger:
        record = make_record(2)
        values, traffic = make_rows(record)
        first = values[0].participant
        link: dict[str, Any] = {column: first}
        linked = [dataclasses.replace(row, **link) for row in values[:2]] + values[2:]
        ledger.commit_round(record, linked, traffic, Checkpoint(2, b"p", "{}"))
        read = [getattr(row, column) for row in ledger.values() if row.round == 2]
        assert read == [first, first] + [""] * (len(values) - 2)
        record = make_record(3)
        values, traffic = make_rows(record)
        unknown: dict[str, Any] = {column: "p099"}  # not received
        stranger = [dataclasses.replace(values[0], **unknown), *values[1:]]
        with pytest.raises(LedgerError, match=refusal):
            ledger.commit_round(record, stranger, traffic, Checkpoint(3, b"p", "{}"))


def _older_ledger(tmp_path: Path, version: int) -> Path:
    """A ledger of one round, as a coordinator of schema `version` left it."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.ensure_run("run-1", CONFIG)
        commit(ledger, 1)
    _downgrade(path, version)
    return path


def _downgrade(path: Path, version: int) -> None:
    """Make a current ledger look like what a coordinator of schema `version` left."""
    with sqlite3.connect(path) as conn:
        if version < 13:  # no look-alike members
            conn.execute("ALTER TABLE round_values DROP COLUMN alike")
        if version < 12:  # no public updates
            conn.execute("ALTER TABLE round_values DROP COLUMN public")
        if version < 11:  # no players of merged members
            conn.execute("ALTER TABLE round_values DROP COLUMN player")
        if version < 10:  # no valuation choice
            conn.execute("ALTER TABLE rounds DROP COLUMN valuation_choice")
        if version < 9:  # no valuation CPU seconds
            conn.execute("ALTER TABLE rounds DROP COLUMN valuation_cpu_seconds")
        if version < 8:  # no update effects
            conn.execute("DROP TABLE update_effects")
        if version < 7:  # no initial scores
            conn.execute("DROP TABLE initial_scores")
        if version < 6:  # no refusals, no values per fold, no validation error per label
            conn.execute("ALTER TABLE rounds DROP COLUMN refused")
            conn.execute("DROP TABLE fold_values")
            conn.execute("ALTER TABLE class_values DROP COLUMN validation")
        if version < 5:  # no values per label
            conn.execute("DROP TABLE class_values")
        if version < 4:  # no standard errors
            conn.execute("ALTER TABLE round_values DROP COLUMN fedsv_stderr")
            conn.execute("ALTER TABLE rounds DROP COLUMN max_stderr")
        if version < 3:  # the status lived in the method: "pending" or "none"
            conn.execute("UPDATE rounds SET method = 'pending' WHERE status = 'pending'")
            conn.execute("UPDATE rounds SET method = 'none' WHERE status = 'not_valued'")
            conn.execute("ALTER TABLE rounds DROP COLUMN status")
        if version < 2:  # no updates, no valued_at
            conn.execute("DROP TABLE updates")
            conn.execute("ALTER TABLE rounds DROP COLUMN valued_at")
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))


def test_a_schema_1_ledger_is_read_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.ensure_run("run-1", CONFIG)
        commit(ledger, 1)
    _downgrade(path, 1)
    with Ledger(path, read_only=True) as reader:
        assert reader.updates() == [] and [r.round for r in reader.rounds()] == [1]
        assert math.isnan(reader.rounds()[0].valued_at)
        assert reader.rounds()[0].status is RoundStatus.VALUED
    with Ledger(path) as ledger:
        commit(ledger, 2)
        assert ledger.updates() == []  # commit() records no update rows
        assert [r.status for r in ledger.rounds()] == [RoundStatus.VALUED] * 2
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == (str(SCHEMA_VERSION),)


def test_a_schema_2_ledger_reads_its_pending_rounds_by_method_and_migrates_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.ensure_run("run-1", CONFIG)
        commit(ledger, 1)
        pending = dataclasses.replace(make_record(2), status=RoundStatus.PENDING, method="", evaluations=0)
        _, traffic = make_rows(pending)
        ledger.commit_round(pending, [], traffic, Checkpoint(2, b"p", "{}"))
    _downgrade(path, 2)
    for read_only in (True, False):  # as it is, then migrated by a writer
        with Ledger(path, read_only=read_only) as ledger:
            records = ledger.rounds()
            assert [r.status for r in records] == [RoundStatus.VALUED, RoundStatus.PENDING]
            assert records[1].method == "" and ledger.pending_rounds() == [2]


def test_a_schema_3_ledger_reads_exact_rounds_as_exact_and_others_as_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.ensure_run("run-1", CONFIG)
        commit(ledger, 1)  # make_record: method "exact"
        sampled = dataclasses.replace(make_record(2), method="regression")
        values, traffic = make_rows(sampled)
        ledger.commit_round(sampled, values, traffic, Checkpoint(2, b"p", "{}"))
    _downgrade(path, 3)
    for read_only in (True, False):
        with Ledger(path, read_only=read_only) as ledger:
            by_round = {(v.round, v.participant): v.fedsv_stderr for v in ledger.values()}
            assert all(e == 0.0 for (n, _), e in by_round.items() if n == 1)
            assert all(math.isnan(e) for (n, _), e in by_round.items() if n == 2)
            first, second = ledger.rounds()
            assert first.max_stderr == 0.0 and math.isnan(second.max_stderr)


def test_initial_scores_are_recorded_once_and_older_files_have_none(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.ensure_run("run-1", CONFIG)
        ledger.record_initial_scores({7: 0.25, 3: 0.5})
        ledger.record_initial_scores({7: 0.9, 11: 0.1})  # a resumed run keeps what it started with
        assert ledger.initial_scores() == [0.5, 0.25]
    _downgrade(path, 6)
    with Ledger(path, read_only=True) as reader:
        assert reader.initial_scores() == []
    with Ledger(path) as ledger:  # migrated: the table is back, empty
        assert ledger.initial_scores() == []
        ledger.record_initial_scores({1: 0.75})
        assert ledger.initial_scores() == [0.75]


def test_standard_errors_round_trip_including_unknown(ledger: Ledger) -> None:
    record = make_record(1)
    values, traffic = make_rows(record)
    values = [
        dataclasses.replace(values[0], fedsv_stderr=0.0125),
        dataclasses.replace(values[1], fedsv_stderr=math.inf),
    ]
    ledger.commit_round(record, values, traffic, Checkpoint(1, b"p", "{}"))
    assert [v.fedsv_stderr for v in ledger.values()] == [0.0125, math.inf]
    bad = make_record(2)
    rows, traffic = make_rows(bad)
    with pytest.raises(LedgerError, match="standard error"):
        ledger.commit_round(
            bad, [dataclasses.replace(rows[0], fedsv_stderr=-1.0)], traffic, Checkpoint(2, b"p", "{}")
        )


def test_a_damaged_ledger_is_refused_by_readers_and_writers_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsv.app.cli import main as fedsv_main

    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as opened:
        opened.ensure_run("run-1", CONFIG)
        for n in range(1, 30):
            commit(opened, n, blob=bytes(range(256)) * 40)
    raw = bytearray(path.read_bytes())
    page = 4096
    assert len(raw) > 8 * page
    raw[5 * page : 6 * page] = b"\xa5" * page  # one page of garbage in the middle of the file
    path.write_bytes(bytes(raw))
    for read_only in (False, True):
        with pytest.raises(LedgerError, match="the ledger is damaged"):
            Ledger(path, read_only=read_only)
    assert fedsv_main(["report", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "damaged" in err and str(path) in err and "Traceback" not in err


def test_refused_updates_are_recorded_with_their_reason(ledger: Ledger) -> None:
    from fedsv.ledger.builder import RoundTimes, build_round_record

    times = RoundTimes(1.0, 2.0, 0.5, 0.1, 0.0, 0.1)
    record = build_round_record(
        1, ["p000", "p001", "p002", "p003"], ["p000", "p001"], None, [], 400, times,
        refused={"p002": "direction_rejected"},
    )  # fmt: skip
    assert record.stragglers == ["p003"] and record.refused == {"p002": "direction_rejected"}
    assert record.absence("p002") == "direction_rejected" and record.absence("p003") == "late"
    assert record.absence("p000") is None
    ledger.commit_round(record, [], [], Checkpoint(1, b"w", "{}"))
    assert ledger.rounds()[0].refused == {"p002": "direction_rejected"}
