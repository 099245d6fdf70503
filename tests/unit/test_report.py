"""`fedsv report` from a hand-built ledger: keys, totals equal FederatedValuation's, files, table, errors."""

from __future__ import annotations

import csv
import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from fedsv.app.cli import main as fedsv_main
from fedsv.app.report import build_report
from fedsv.app.report_files import write_outputs
from fedsv.app.report_text import format_table
from fedsv.ledger import (
    Checkpoint,
    ClassValueRow,
    Ledger,
    LedgerError,
    RoundStatus,
    TrafficRow,
    UpdateRow,
    ValuationSummary,
    ValueRow,
)
from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.accounting.rounds import TOTAL_KEYS
from tests.support.records import make_record

# round -> (selected, received, fedsv of the received, loo of the received)
ROUNDS = {
    1: (["p000", "p001", "p002", "p004"], ["p000", "p001", "p002"], [0.05, 0.02, -0.01], [0.04, 0.01, -0.02]),
    2: (["p001", "p002", "p003"], ["p001", "p002", "p003"], [0.01, 0.03, 0.0], [0.0, 0.02, 0.0]),
    3: (["p000", "p003"], ["p000", "p003"], [0.004, 0.006], [0.003, 0.005]),
}
# fmt: off
ROUND_KEYS = {
    "round", "selected", "received", "stragglers", "utility_before", "utility_after", "test_accuracy",
    "values", "loo", "method", "valuation_choice", "valuation_seconds", "utility_evaluations", "bytes_up",
    "bytes_down", "messages_up", "messages_down", "physical_minimum_bytes", "bytes_ratio_to_minimum",
    "group_rationality_residual",
}
# fmt: on
STDERR = {3: [0.003, 0.001]}  # round 3 was sampled; rounds 1 and 2 exact
CONFIG = {"rounds": 3, "participants": 5, "corrupt": "2=flip:0.5"}
PARTICIPANTS = ["p000", "p001", "p002", "p003", "p004"]  # p004 was selected once and never delivered


def normalized(values: list[float]) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    return v / np.linalg.norm(v)


@pytest.fixture
def run_dir(tmp_path: Path) -> tuple[Path, FederatedValuation]:
    return made_up_run(tmp_path)


def made_up_run(tmp_path: Path) -> tuple[Path, FederatedValuation]:
    """A run directory whose ledger holds ROUNDS, and the valuation it must read back as."""
    directory = tmp_path / "run"
    directory.mkdir()
    expected = FederatedValuation(PARTICIPANTS)  # the run's 5 participants (its config)
    with Ledger(directory / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-test", CONFIG)
        for n, (selected, received, fedsv, loo) in ROUNDS.items():
            base = make_record(n, selected, received)
            after = base.utility_before + sum(fedsv)
            record = type(base)(**{**base.__dict__, "utility_after": after})
            errors = STDERR.get(n, [0.0] * len(received))
            method = "regression" if n in STDERR else "exact"
            record = type(base)(**{**record.__dict__, "method": method, "max_stderr": max(errors)})
            rv = RoundValues(
                n, received, np.array(fedsv), np.array(loo), base.utility_before, after, method, 8, 0.01,
                np.array(errors), selected=selected,
            )  # fmt: skip
            expected.add_round(rv)
            fn, ln = normalized(fedsv), normalized(loo)
            values = [
                ValueRow(n, p, fedsv[i], loo[i], float(fn[i]), float(ln[i]), errors[i])
                for i, p in enumerate(received)
            ]
            traffic = [
                TrafficRow(n, "SubmitUpdate", "up", record.bytes_up, 3),
                TrafficRow(n, "Join", "up", 10, 1),
            ]
            traffic.append(TrafficRow(n, "Subscribe", "down", record.bytes_down, 4))
            updates = [UpdateRow(n, pid, 100 + int(pid[1:]), 0.5) for pid in received]  # p003 holds 103
            ledger.commit_round(record, values, traffic, Checkpoint(n, b"w", "{}"), updates)
    return directory, expected


def test_report_keys_and_totals(run_dir: tuple[Path, FederatedValuation]) -> None:
    directory, expected = run_dir
    report = build_report(directory)
    json.dumps(report, allow_nan=False)  # plain JSON
    assert report["run_id"] == "run-test" and report["config"] == CONFIG
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    first = report["rounds"][0]
    assert not ROUND_KEYS - set(first)
    assert first["stragglers"] == ["p004"] and first["values"] == {"p000": 0.05, "p001": 0.02, "p002": -0.01}
    assert first["loo"]["p002"] == -0.02
    assert first["physical_minimum_bytes"] == 400 * (4 + 3)
    assert first["bytes_ratio_to_minimum"] == pytest.approx(3000 / 2800)
    totals = expected.totals()
    assert set(report["totals"]) == set(TOTAL_KEYS)
    assert set(TOTAL_KEYS) == {"fedsv", "fedsv_normalized", "fedsv_completed", "fedsv_shrunk", "loo"} | {
        "loo_normalized"
    }
    for key, per_participant in totals.items():
        assert report["totals"][key] == pytest.approx(per_participant)
    _, completed = expected.completed()  # how the completion went, for the reader
    assert report["completion"] == {
        "model": completed.model,
        "holdout_rmse": None,  # too few values to cross-validate: the completed errors are unknown
        "observed": pytest.approx(completed.observed),
    }
    assert math.isinf(completed.holdout_rmse)
    assert report["final_accuracy"] == pytest.approx(0.53)
    assert report["traffic"]["SubmitUpdate"]["up"] == {"bytes": 6000, "messages": 9}
    assert report["traffic"]["Join"]["up"] == {"bytes": 30, "messages": 3}
    assert report["traffic"]["Subscribe"]["down"] == {"bytes": 12000, "messages": 12}
    assert report["summary"]["rounds"] == 3 and report["summary"]["participants"] == PARTICIPANTS
    assert report["summary"]["corrupted"] == {"p002": "flip:0.5"}


def test_write_outputs_and_table(run_dir: tuple[Path, FederatedValuation]) -> None:
    directory, expected = run_dir
    outputs = write_outputs(directory)
    assert set(outputs) == {"report.json", "values.csv", "values.png", "report.html"}
    assert all(path.parent == directory and path.is_file() for path in outputs.values())
    assert outputs["values.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(outputs["report.json"].read_text())
    with outputs["values.csv"].open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["participant"] for r in rows) == PARTICIPANTS
    assert list(rows[0]) == ["participant", "rounds_selected", "rounds_refused", "rounds_quarantined",
                             "rounds_public", "num_samples", *TOTAL_KEYS,
                             *(f"{key}_stderr" for key in TOTAL_KEYS), "rank", "group",
                             "separated_from_next"]  # fmt: skip
    fedsv = expected.totals()["fedsv"]
    completed = expected.totals()["fedsv_completed"]  # the recommended value ranks
    best = max(completed, key=lambda p: completed[p])
    assert rows[0]["participant"] == best and rows[0]["rank"] == "1"
    assert [int(r["rank"]) for r in rows] == [1, 2, 3, 4, 5]
    by_id = {r["participant"]: r for r in rows}
    assert by_id["p004"]["rounds_selected"] == "1" and float(by_id["p004"]["fedsv"]) == 0.0
    # The sample count each declared (FedAvg's weight) is shown; never aggregated: none.
    assert by_id["p003"]["num_samples"] == "103" and by_id["p004"]["num_samples"] == ""
    assert float(by_id["p001"]["fedsv"]) == pytest.approx(fedsv["p001"])
    # No values per validation fold recorded: the validation set's part, so the total, is unknown; the
    # estimator's part is known (the sampled round's 0.003, exact rounds 0).
    assert by_id["p000"]["fedsv_stderr"] == "" and by_id["p002"]["fedsv_stderr"] == ""
    estimator = report["stderr_parts"]["estimator"]
    assert estimator["fedsv"]["p000"] == pytest.approx(expected.error_parts()["estimator"]["fedsv"]["p000"])
    assert estimator["fedsv"]["p000"] == pytest.approx(0.003) and estimator["fedsv"]["p002"] == 0.0
    table = format_table(report)
    assert all(pid in table for pid in PARTICIPANTS)
    assert "0.05400 ± ?" in table and "verdict:" in table  # no folds recorded: the error is unknown
    assert "final test accuracy 0.5300" in table and "3 rounds" in table and "physical minimum" in table
    assert "fedsv_norm" in table and "p002" in table.split("corrupted: flip:0.5")[0].splitlines()[-1]


def test_look_alike_members_are_named_with_the_rounds_they_looked_alike_in(tmp_path: Path) -> None:
    """A ledger whose round 2 found p001 and p002 alike (valued apart: merging off): report.json's round
    and `lookalikes` say so, counting the rounds both were valued in (1 and 2), the table and the page
    name them, and nothing else changes."""
    directory, expected = made_up_run(tmp_path)
    before = build_report(directory)
    assert before["lookalikes"] == [] and "look alike" not in format_table(before)
    with sqlite3.connect(directory / "ledger.sqlite") as raw:
        raw.execute(
            "UPDATE round_values SET alike = 'p001' WHERE round = 2 AND participant IN ('p001', 'p002')"
        )
    report = build_report(directory)
    assert [entry["alike"] for entry in report["rounds"]] == [[], [["p001", "p002"]], []]
    assert report["lookalikes"] == [{"members": ["p001", "p002"], "rounds": 1, "together": 2}]
    assert report["owners"] == [] and report["verdict"] == before["verdict"]
    for key, per_participant in expected.totals().items():  # named only: valued apart, as before
        assert report["totals"][key] == pytest.approx(per_participant)
    line = "p001 and p002 look alike: their updates were far more alike than independent data give in 1 of"
    assert line in format_table(report)
    assert "p001 and p002 look alike" in write_outputs(directory)["report.html"].read_text()


def test_missing_run_dir_or_ledger_is_a_one_line_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist") as missing:
        build_report(tmp_path / "nowhere")
    assert "\n" not in str(missing.value)
    with pytest.raises(ValueError, match=r"no ledger\.sqlite") as no_ledger:
        write_outputs(tmp_path)
    assert "\n" not in str(no_ledger.value)


def test_an_inconsistent_ledger_is_a_one_line_error(
    run_dir: tuple[Path, FederatedValuation], capsys: pytest.CaptureFixture[str]
) -> None:
    """A value row of a round the ledger has no record of (an orphan) is named, not a KeyError."""
    directory, _ = run_dir
    with sqlite3.connect(directory / "ledger.sqlite") as conn:
        conn.execute("DELETE FROM rounds WHERE round = 2")  # its value rows stay behind: orphans
    assert fedsv_main(["report", str(directory)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsv report: error:") and "\n" not in err and "round 2" in err, err


def test_adjacent_ranks_within_their_combined_error_are_marked() -> None:
    """By their errors against each other: the parts that move every member alike (another initial
    model) do not weigh on a difference."""
    from fedsv.app.report import separated

    a = {"fedsv": 0.10, "fedsv_stderr_between": 0.01}
    assert (
        separated(a, {"fedsv": 0.05, "fedsv_stderr_between": 0.01}, "fedsv") is True
    )  # 0.05 > 1.96 * 0.0141
    assert separated(a, {"fedsv": 0.08, "fedsv_stderr_between": 0.01}, "fedsv") is False
    assert separated(a, {"fedsv": 0.10, "fedsv_stderr_between": 0.0}, "fedsv") is False  # a tie
    exact = {"fedsv": 0.1, "fedsv_stderr_between": 0.0}
    assert separated(exact, {"fedsv": 0.09, "fedsv_stderr_between": 0.0}, "fedsv") is True
    assert separated(a, {"fedsv": 0.0, "fedsv_stderr_between": None}, "fedsv") is None
    common = {"fedsv": 0.10, "fedsv_stderr_between": 0.001, "fedsv_stderr": 0.05}
    assert separated(common, {"fedsv": 0.09, "fedsv_stderr_between": 0.001, "fedsv_stderr": 0.05}, "fedsv")


def test_values_per_label_are_stored_reported_and_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    record = make_record(1, ["p000", "p001"], ["p000", "p001"])
    values = [ValueRow(1, "p000", 0.03, 0.02, 0.9, 0.8), ValueRow(1, "p001", -0.01, 0.0, -0.3, 0.0)]
    by_label = {"p000": [0.02, 0.01, 0.0], "p001": [0.01, -0.025, 0.005]}  # they sum to the values
    classes = [ClassValueRow(1, pid, k, v, 0.0) for pid, row in by_label.items() for k, v in enumerate(row)]
    with Ledger(directory / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-labels", {"participants": 2})
        ledger.commit_round(record, values, [], Checkpoint(1, b"w", "{}"), classes=classes)
        assert ledger.class_values() == classes
        with pytest.raises(LedgerError, match="per label"):
            bad = make_record(2, ["p000"], ["p000"])
            ledger.commit_round(
                bad, [], [], Checkpoint(2, b"w", "{}"), classes=[ClassValueRow(2, "p009", 0, 0.1, 0.0)]
            )
    report = build_report(directory)
    assert report["classes"]["labels"] == 3 and report["classes"]["totals"] == by_label
    outputs = write_outputs(directory)
    assert outputs["class_values.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with outputs["values.csv"].open() as handle:
        rows = {r["participant"]: r for r in csv.DictReader(handle)}
    assert [float(rows["p001"][f"fedsv_label_{k}"]) for k in range(3)] == by_label["p001"]
    assert fedsv_main(["report", str(directory), "--by-class"]) == 0
    printed = capsys.readouterr().out
    assert "1 of 1 rounds split" in printed and "-0.02500" in printed


def test_rounds_awaiting_values_show_partial_totals_never_certain_zeros(tmp_path: Path) -> None:
    """A run stopped while its backlog was valued: the rounds awaiting values are named, a member selected
    in them has a partial total with an unknown error, and with no round valued every total is unknown."""
    directory = tmp_path / "run"
    directory.mkdir()
    with Ledger(directory / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-partial", {"participants": 4, "rounds": 2})
        for n in (1, 2):
            record = make_record(n, ["p000", "p001"], ["p000", "p001"])
            pending = type(record)(**{**record.__dict__, "status": RoundStatus.PENDING, "method": ""})
            ledger.commit_round(pending, [], [], Checkpoint(n, b"w", "{}"))
    report = build_report(directory)
    assert report["pending_rounds"] == [1, 2]
    assert all(value is None for table in report["totals"].values() for value in table.values())
    assert set(report["totals"]["fedsv"]) == {"p000", "p001", "p002", "p003"}  # every member, none as 0
    table = format_table(report)
    assert "PARTIAL: rounds 1, 2 await their values" in table and "0.00000 ± 0 " not in table
    with Ledger(directory / "ledger.sqlite") as ledger:  # round 1 gets its values; round 2 still waits
        ledger.commit_values(
            1,
            [ValueRow(1, "p000", 0.03, 0.02, 0.8, 0.7, 0.0), ValueRow(1, "p001", 0.01, 0.0, 0.6, 0.0, 0.0)],
            ValuationSummary(0.1, 0.14, "exact", 4, 0.01, 0.0, 1.0, 0.0),
        )
    report = build_report(directory)
    assert report["pending_rounds"] == [2]
    assert report["totals"]["fedsv"]["p000"] == pytest.approx(0.03)  # partial: round 1 alone
    assert report["stderr"]["fedsv"]["p000"] is None and report["stderr"]["fedsv_completed"]["p002"] is None
    assert report["totals"]["fedsv"]["p002"] is None  # never selected: not valued, never a certain 0
    assert report["not_valued"] == ["p002", "p003"]
    assert "PARTIAL: rounds 2 await their values (1 of 2 rounds valued)" in format_table(report)
