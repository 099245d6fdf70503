"""Dishonest participants under the default settings, through `fedsv launch` (real processes, gRPC).

The attack matrix (docs/deployment.md#security): from one participant among three selected, and in
rounds of two updates, each attack costs at most 0.02 of final test accuracy against the honest run of
the same seed, and the guard turns the attacker's updates away; a free rider that sends the global
model back untrained, declaring 10^7 samples, is turned away in every round it is selected in; two
colluders among six are turned away and cost far less than before (issue 34's target of 0.02 is not
met in every cell yet: docs/deployment.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsv.ledger import Ledger
from tests.support.runtime import launch

pytestmark = pytest.mark.slow

RUN: dict[str, object] = {
    "participants": 6,
    "rounds": 8,
    "epochs": 5,
    "validation_size": 300,
    "valuation": "none",
    "seed": 0,
}
ATTACKS = {
    "x1e6": "scale:1e6",
    "sign flip": "scale:-1",
    "-3x (its own, in IID the others' mean)": "scale:-3",
    "10^7 declared, reversed": "scale:-1+count:10000000",
    "free rider (replay, 10^7 declared)": "replay+count:10000000",
}


def _final_accuracy(
    out: Path, settings: dict[str, object]
) -> tuple[float, list[tuple[list[str], list[str]]]]:
    proc = launch(out, settings, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
    assert [r.round for r in rounds] == list(range(1, 9))
    return rounds[-1].test_accuracy, [(r.selected, r.received) for r in rounds]


@pytest.mark.parametrize(
    ("fraction", "attacks"),
    [(0.5, list(ATTACKS)), (0.34, ["10^7 declared, reversed"])],
    ids=["3 selected", "2 selected"],
)
def test_one_attacker_costs_at_most_two_points_of_accuracy(
    tmp_path: Path, fraction: float, attacks: list[str]
) -> None:
    settings = {**RUN, "fraction": fraction}
    honest, _ = _final_accuracy(tmp_path / "honest", settings)
    for name in attacks:
        out = tmp_path / name.split()[0]
        spec = ATTACKS[name] if "=" in ATTACKS[name] else f"3={ATTACKS[name]}"
        attacked, rounds = _final_accuracy(out, {**settings, "corrupt": spec})
        assert abs(attacked - honest) <= 0.02, (name, attacked, honest)
        turned_away = [
            i for i, (selected, received) in enumerate(rounds, 1) if "p003" in set(selected) - set(received)
        ]
        assert turned_away, (name, rounds)
        if name.startswith("free rider"):  # every time: never aggregated, worth nothing
            assert all("p003" not in received for _, received in rounds), rounds


def test_two_colluders_are_turned_away_and_cost_far_less_than_before(tmp_path: Path) -> None:
    """Ranks 3 and 4 both send minus three times their update (in IID about minus three times the
    others' mean). Before the round referee (update_screen) they defeated the guard: final accuracy
    0.327 against 0.900; now within 0.05 of the honest run (0.023 at seed 0), each turned away."""
    settings = {**RUN, "fraction": 0.5}
    honest, _ = _final_accuracy(tmp_path / "honest", settings)
    attacked, rounds = _final_accuracy(tmp_path / "colluders", {**settings, "corrupt": "3-4=scale:-3"})
    assert abs(attacked - honest) <= 0.05, (attacked, honest)
    for pid in ("p003", "p004"):
        assert any(pid in set(selected) - set(received) for selected, received in rounds), (pid, rounds)
