"""An owner that joins twice through `fedsv launch` (real coordinator and participant processes, gRPC,
mutual TLS) with --valuation-merge-redundant: its second identity holds a copy of its data and trains
with its own shuffling. Every round values the two as one player, the ledger keeps it, the report
names them one owner and tests it as one member, and `fedsv payout --rule groups` pays the two
together no more than another owner of their group. With merging off, the two are valued apart and
named as look-alikes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedsv.ledger import Ledger
from tests.support.runtime import launch

pytestmark = pytest.mark.slow

RUN: dict[str, object] = {
    "participants": 6,
    "fraction": 1.0,
    "rounds": 3,
    "valuation": "exact",
    "seed": 0,
    "corrupt": "5=copy:2",
    "valuation_merge_redundant": True,
}


def test_an_owner_that_joins_twice_is_one_owner_in_the_ledger_report_and_payout(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = launch(out, RUN, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        players = {(row.round, row.participant): row.player for row in ledger.values()}
    assert {players[r, "p002"] for r in (1, 2, 3)} == {"p002"} == {players[r, "p005"] for r in (1, 2, 3)}
    assert {p for (_, pid), p in players.items() if pid not in ("p002", "p005")} == {""}
    by_value = _payout(out)  # each by its own recommended value: the owner's split between its two
    others = [amount for pid, amount in by_value.items() if pid not in ("p002", "p005")]
    assert by_value["p002"] == pytest.approx(by_value["p005"])
    assert by_value["p002"] + by_value["p005"] <= 1.1 * max(others), by_value
    amounts = _payout(out, "--rule", "groups")
    report = json.loads((out / "report.json").read_text())
    assert report["owners"] == [["p002", "p005"]]
    assert report["verdict"]["members_tested"] == 5  # five owners of six identities
    group = next(g for g in report["verdict"]["groups"] if "p002" in g)
    assert "p005" in group, report["verdict"]["groups"]
    assert amounts["p002"] == pytest.approx(amounts["p005"])
    for pid in group:
        if pid not in ("p002", "p005"):  # the owner's two identities together: one owner's amount
            assert amounts["p002"] + amounts["p005"] == pytest.approx(amounts[pid], rel=1e-6), amounts
    assert sum(amounts.values()) == pytest.approx(10000)


def test_with_merging_off_the_two_identities_are_valued_apart_and_named_alike(tmp_path: Path) -> None:
    """The same owner with merging off (the default): each identity is its own member, and every round,
    the ledger, report.json and `fedsv report` name the two as look-alikes."""
    out = tmp_path / "run"
    proc = launch(out, {**RUN, "valuation_merge_redundant": False}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        rows = ledger.values()
    assert {row.player for row in rows} == {""}
    alike = {(row.round, row.participant): row.alike for row in rows}
    assert {alike[r, pid] for r in (1, 2, 3) for pid in ("p002", "p005")} == {"p002"}, alike
    assert {a for (_, pid), a in alike.items() if pid not in ("p002", "p005")} == {""}
    report = json.loads((out / "report.json").read_text())
    assert report["owners"] == [] and report["verdict"]["members_tested"] == 6
    assert report["lookalikes"] == [{"members": ["p002", "p005"], "rounds": 3, "together": 3}]
    shown = subprocess.run(
        [sys.executable, "-m", "fedsv", "report", str(out)], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "p002 and p005 look alike" in shown.stdout and "in 3 of the 3 rounds" in shown.stdout


def _payout(out: Path, *options: str) -> dict[str, float]:
    paid = subprocess.run(
        [sys.executable, "-m", "fedsv", "payout", str(out), "--amount", "10000", *options],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert paid.returncode == 0, paid.stderr
    with (out / "payout.csv").open() as handle:
        return {row["participant"]: float(row["amount"]) for row in csv.DictReader(handle)}
