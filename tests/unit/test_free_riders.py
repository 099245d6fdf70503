"""A free rider earns nothing: its null update is turned away in every round, valued 0, paid nothing."""

from __future__ import annotations

from typing import Any

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.app.payout import shares
from fedsv.settings.choices import ValuationMethod


def _six_members(**settings: Any) -> DemoConfig:
    """Six members, three a round, exact values, and `settings`."""
    return DemoConfig(participants=6, fraction=0.5, valuation=ValuationMethod.EXACT, **settings)


def test_a_free_rider_is_refused_every_time_and_gets_nothing() -> None:
    """The global model sent back untrained under a false count of 10^7 (update_guard's unit tests cover
    noise and the other null updates)."""
    rider = "replay+count:10000000"
    config = _six_members(rounds=4, seed=1, validation_size=300, corrupt=f"3={rider}")
    result = run_demo(config)
    rounds = result.valuation.per_round()
    picked = [r.round for r in rounds if "p003" in (r.selected or r.participants)]
    assert picked, "the seed must select the free rider at least once"
    assert all("p003" not in r.participants for r in rounds)  # never aggregated, still on record
    totals = result.valuation.totals()
    assert totals["fedsv"]["p003"] == 0.0 and totals["fedsv_shrunk"]["p003"] == 0.0
    ids = sorted(totals["fedsv_shrunk"])
    values = [totals["fedsv_shrunk"][p] or 0.0 for p in ids]
    honest = [v for p, v in zip(ids, values, strict=True) if p != "p003"]
    assert all(v > 0 for v in honest)  # below every honest member whose value lies above 0
    assert shares(values, [None] * len(ids), 1.0, "zero")[ids.index("p003")][0] == 0.0


def test_with_the_screens_off_a_mimic_is_aggregated_and_paid_nothing() -> None:
    """`update_direction` off: the mimic (the federation's own step from the models it received) is
    aggregated, but each of its updates is public (nothing beyond the recent steps; its first, a zero,
    nothing at all): every coalition of its rounds holds it, it is valued exactly 0 there, and the run
    counts it as never aggregated for pay, so no pull towards members it looks like pays it anything."""
    config = _six_members(rounds=8, seed=0, corrupt="5=mimic", update_direction=False)
    result = run_demo(config)
    rounds = result.valuation.per_round()
    aggregated = [r for r in rounds if "p005" in r.participants]
    assert len(aggregated) >= 2 and all(r.public == ["p005"] for r in aggregated)
    assert all(r.fedsv[r.participants.index("p005")] == 0.0 for r in aggregated)
    assert all(not r.public for r in rounds if r not in aggregated)
    totals = result.valuation.totals()
    for key in ("fedsv", "fedsv_completed", "fedsv_shrunk"):
        assert totals[key]["p005"] == 0.0, key
    ids = sorted(totals["fedsv_shrunk"])
    values = [totals["fedsv_shrunk"][p] or 0.0 for p in ids]
    assert all(v > 0 for p, v in zip(ids, values, strict=True) if p != "p005")
    assert shares(values, [None] * len(ids), 1.0, "zero")[ids.index("p005")][0] == 0.0
