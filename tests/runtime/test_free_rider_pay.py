"""A disguised free rider through `fedsv launch` (real coordinator and participant processes, gRPC,
mutual TLS): it holds data but trains nothing and sends the federation's own recent step from the
global models it received, plus noise of that step's size. The guard turns it away in every round it
is selected in (its first update is a zero, null; every later one a mimic's, public_step), and `fedsv
payout` pays it nothing while every honest member is paid. With the guard's direction check and screens
off (`--no-update-direction`) it is aggregated, and still paid nothing: every update of it is marked
public (nothing beyond the global model's recent steps), every coalition of its rounds' games holds it,
and its value is 0. A member that trains on inputs and labels it made up is turned away as made_up in
every round it is selected in, and paid nothing."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from fedsv.ledger import Ledger
from tests.support.runtime import launch

pytestmark = pytest.mark.slow

RUN: dict[str, object] = {
    "participants": 6,
    "fraction": 0.5,
    "rounds": 8,
    "validation_size": 300,
    "valuation": "exact",
    "seed": 7,
    "corrupt": "5=mimic:1",
}


def test_a_mimicking_free_rider_is_turned_away_and_paid_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = launch(out, RUN, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
    chosen = [r for r in rounds if "p005" in r.selected]
    assert len(chosen) >= 2, [r.selected for r in rounds]
    reasons = [r.refused.get("p005") for r in chosen]
    assert reasons[0] == "null_update" and set(reasons[1:]) == {"public_step"}, reasons
    assert all(set(r.refused) <= {"p005"} for r in rounds), [r.refused for r in rounds]  # honest: kept
    _paid_nothing(out)


def test_with_the_screens_off_a_mimic_is_aggregated_and_still_paid_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = launch(out, {**RUN, "update_direction": False}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        rounds, values = ledger.rounds(), ledger.values()
    assert not any(set(r.refused.values()) & {"null_update", "public_step"} for r in rounds)
    rider = [v for v in values if v.participant == "p005"]
    assert len(rider) >= 2 and all(v.public and v.fedsv == 0.0 and v.loo == 0.0 for v in rider), rider
    assert not any(v.public for v in values if v.participant != "p005")
    with (out / "values.csv").open() as handle:  # the report says in how many rounds, of whom
        public = {row["participant"]: int(row["rounds_public"]) for row in csv.DictReader(handle)}
    assert public == {f"p{r:03d}": len(rider) if r == 5 else 0 for r in range(6)}, public
    _paid_nothing(out)


def test_a_member_with_made_up_data_is_turned_away_and_paid_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = launch(out, {**RUN, "corrupt": "5=madeup"}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
    chosen = [r.refused.get("p005") for r in rounds if "p005" in r.selected]
    # turned away every time: by the made-up-input screen, or first by the trusted step (its update
    # also points against the validation set's own step now and then)
    assert chosen.count("made_up") >= 2 and set(chosen) <= {"made_up", "against_validation"}, chosen
    assert all(set(r.refused) <= {"p005"} for r in rounds), [r.refused for r in rounds]  # honest: kept
    _paid_nothing(out)


def _paid_nothing(out: Path) -> None:
    """`fedsv payout` pays p005 nothing and every honest member something, the whole amount."""
    paid = subprocess.run(
        [sys.executable, "-m", "fedsv", "payout", str(out), "--amount", "10000"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert paid.returncode == 0, paid.stderr
    with (out / "payout.csv").open() as handle:
        amounts = {row["participant"]: float(row["amount"]) for row in csv.DictReader(handle)}
    assert set(amounts) == {f"p{r:03d}" for r in range(6)}
    assert amounts["p005"] == 0.0, amounts
    assert min(amounts[f"p{r:03d}"] for r in range(5)) > 0, amounts
    assert sum(amounts.values()) == pytest.approx(10000)
