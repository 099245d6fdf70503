"""`fedsv payout`: shares by value, a rule for negative values, ranges over the 95% intervals, refusals."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

from fedsv.app.cli import main as fedsv_main
from fedsv.app.payout import format_payout, held_out, payout, payout_of, shares
from fedsv.app.report import build_report
from fedsv.app.report_page import render_page
from fedsv.app.report_text import format_table
from fedsv.ledger import Checkpoint, Ledger, RoundStatus, ValueRow
from fedsv.valuation.accounting.verdict import Z95
from tests.support.records import make_record, one_round_run

PIDS = ["p000", "p001", "p002"]


def run_dir(tmp_path: Path, fedsv: list[float], stderr: list[float], pending: bool = False) -> Path:
    directory = tmp_path / "run"
    directory.mkdir()
    with Ledger(directory / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-pay", {"participants": 3, "rounds": 2 if pending else 1})
        record = make_record(1, PIDS, PIDS)
        rows = [ValueRow(1, p, v, 0.0, 0.0, 0.0, e) for p, v, e in zip(PIDS, fedsv, stderr, strict=True)]
        ledger.commit_round(record, rows, [], Checkpoint(1, b"w", "{}"))
        if pending:
            later = make_record(2, PIDS, PIDS)
            later = type(later)(**{**later.__dict__, "status": RoundStatus.PENDING, "method": ""})
            ledger.commit_round(later, [], [], Checkpoint(2, b"w", "{}"))
    return directory


def test_shares_split_the_budget_by_value_and_zero_pays_negatives_nothing(tmp_path: Path) -> None:
    rows = {s.participant: s for s in payout(run_dir(tmp_path, [0.06, 0.02, -0.01], [0.0] * 3), 900.0)}
    assert rows["p000"].amount == pytest.approx(675.0) and rows["p001"].amount == pytest.approx(225.0)
    assert rows["p002"].amount == 0.0 and sum(s.share or 0.0 for s in rows.values()) == pytest.approx(1.0)
    # one round: a rerun's part of the error cannot be told, so neither can the range
    assert rows["p000"].amount_low is None and rows["p000"].amount_high is None


def test_shift_pays_the_gaps_above_the_lowest() -> None:
    split = shares([0.06, 0.02, -0.01], [0.0] * 3, 700.0, "shift")
    assert [s[1] for s in split] == pytest.approx([700 * 0.07 / 0.10, 700 * 0.03 / 0.10, 0.0])


def test_the_range_spans_the_values_95_percent_intervals() -> None:
    (_, amount, low, high), *_ = shares([0.05, 0.05], [0.01, 0.01], 100.0, "zero")
    assert amount == pytest.approx(50.0) and low < 50.0 < high
    assert low == pytest.approx(100 * (0.05 - Z95 * 0.01) / 0.1) and high == pytest.approx(
        100 * (0.05 + Z95 * 0.01) / 0.1
    )
    (_, _, low, high), _ = shares([0.05, 0.05], [math.inf, 0.01], 100.0, "zero")
    assert math.isnan(low) and math.isnan(high)  # its own error unknown: its range is too


def test_an_unfinished_run_and_bad_settings_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pending = run_dir(tmp_path, [0.06, 0.02, 0.01], [0.0] * 3, pending=True)
    assert fedsv_main(["payout", str(pending), "--amount", "100"]) == 2
    assert "not fully valued yet" in capsys.readouterr().err
    refusals = [
        (["--value", "shapiq"], "value must be one of"),
        (["--negative", "x"], "negative must"),
        (["--amount", "-5"], "amount must be a positive"),
    ]
    for flags, message in refusals:
        args = ["payout", str(pending), "--amount", "100", *flags]
        assert fedsv_main(args) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err


def test_the_cli_writes_the_payout_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = run_dir(tmp_path, [0.03, 0.01, 0.0], [0.002, 0.001, 0.0])
    assert fedsv_main(["payout", str(directory), "--amount", "1000", "--value", "fedsv"]) == 0
    assert "payout of 1,000.00 by fedsv" in capsys.readouterr().out
    with (directory / "payout.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["participant"] for r in rows] == ["p000", "p001", "p002"]
    assert rows[0]["amount_low"] == rows[0]["amount_high"] == ""  # one round: a rerun's error is unknown
    assert float(rows[0]["amount"]) == pytest.approx(750.0)


def test_the_groups_rule_pays_members_that_cannot_be_told_apart_alike(tmp_path: Path) -> None:
    directory = run_dir(tmp_path, [0.03, 0.01, 0.0], [0.002, 0.001, 0.0])
    by_value = {s.participant: s for s in payout(directory, 900.0, "fedsv")}
    grouped = {s.participant: s for s in payout(directory, 900.0, "fedsv", rule="groups")}
    # errors unknown (one round): every member is a group of its own, so the rule changes nothing
    assert {p: s.amount for p, s in grouped.items()} == pytest.approx(
        {p: s.amount for p, s in by_value.items()}
    )
    with pytest.raises(ValueError, match="rule must be one of"):
        payout(directory, 900.0, rule="luck")


def test_a_member_never_selected_is_not_valued_and_its_part_is_held_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = one_round_run(tmp_path / "run", 4, [0.03, 0.01, 0.0])  # four members; three selected
    report = build_report(directory)
    assert report["not_valued"] == ["p003"]
    assert all(report["totals"][key]["p003"] is None for key in report["totals"])  # never a certain 0
    assert "p003" not in [pid for group in report["verdict"]["groups"] for pid in group]
    assert "NOT VALUED: p003" in format_table(report)
    assert "not valued (never selected)" in render_page(report)
    shares_of = {s.participant: s for s in payout(directory, 1000.0, "fedsv")}
    assert not shares_of["p003"].valued and shares_of["p003"].amount is None
    # the three valued members split three quarters; the fourth quarter is held out, not given away
    assert shares_of["p000"].amount == pytest.approx(562.5) and shares_of["p001"].amount == pytest.approx(
        187.5
    )
    assert held_out(list(shares_of.values()), 1000.0) == pytest.approx(250.0)
    assert fedsv_main(["payout", str(directory), "--amount", "1000", "--value", "fedsv"]) == 0
    printed = capsys.readouterr().out
    assert "held out of the split: 250.00 (1 of 4 equal parts) for p003" in printed


def _improved_run(tmp_path: Path, after: float) -> dict[str, Any]:
    """A one-round run of three members whose model went from 0.5 to `after`, every recommended value
    set at or below 0 (as a pooled value of an improving run came out in issue 71) and FedSV's as the
    round gave them."""
    report = build_report(one_round_run(tmp_path / "run", 3, [0.03, 0.01, -0.01], utility=(0.5, after)))
    for key in ("fedsv_shrunk", "fedsv_completed"):
        report["totals"][key] = dict.fromkeys(PIDS, -0.001)
    return report


def test_a_recommended_value_that_pays_nobody_falls_back_to_fedsv_where_the_model_improved(
    tmp_path: Path,
) -> None:
    report = _improved_run(tmp_path, after=0.9)
    rows = payout_of(report, 900.0)
    assert {row.paid_by for row in rows} == {"fedsv"}
    assert [row.amount for row in rows] == pytest.approx([675.0, 225.0, 0.0])  # FedSV's 0.03 : 0.01 : 0
    assert "fedsv_shrunk pays nobody (no value above 0) though the model improved: paid by fedsv" in (
        format_payout(rows, 900.0, "fedsv_shrunk", "zero")
    )
    with pytest.raises(ValueError, match="no participant has a value to pay by"):
        payout_of(report, 900.0, "fedsv_completed")  # a value asked for by name is not replaced


def test_every_value_at_or_below_zero_in_a_run_that_did_not_improve_pays_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no participant has a value to pay by"):
        payout_of(_improved_run(tmp_path, after=0.4), 900.0)


def test_a_member_that_sent_another_members_very_update_is_paid_nothing(tmp_path: Path) -> None:
    """The guard's identical_update refusal is the coordinator's evidence of collusion: the member is paid
    nothing for the run, whatever it earned in other rounds, and the others split the whole budget."""
    directory = tmp_path / "run"
    directory.mkdir()
    with Ledger(directory / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-collude", {"participants": 3, "rounds": 2})
        rows = [ValueRow(1, p, v, 0.0, 0.0, 0.0, 0.0) for p, v in zip(PIDS, [0.03, 0.01, 0.05], strict=True)]
        ledger.commit_round(make_record(1, PIDS, PIDS), rows, [], Checkpoint(1, b"w", "{}"))
        second = make_record(2, PIDS, ["p000", "p001"])
        second = type(second)(
            **{**second.__dict__, "stragglers": [], "refused": {"p002": "identical_update"}}
        )
        rows = [ValueRow(2, p, 0.02, 0.0, 0.0, 0.0, 0.0) for p in ("p000", "p001")]
        ledger.commit_round(second, rows, [], Checkpoint(2, b"w", "{}"))
    paid = {s.participant: s for s in payout(directory, 100.0, value="fedsv")}
    assert (
        paid["p002"].amount == 0.0
        and paid["p002"].forfeited == 1
        and paid["p002"].value == pytest.approx(0.05)
    )
    assert paid["p000"].amount == pytest.approx(62.5) and paid["p001"].amount == pytest.approx(37.5)
    text = format_payout(list(paid.values()), 100.0, "fedsv", "zero")
    assert "p002 is paid nothing: in 1 round(s) it sent the very update another member sent" in text
