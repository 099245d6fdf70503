"""A free rider earns nothing: its null update is turned away in every round, valued 0, paid nothing."""

from __future__ import annotations

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.app.payout import shares
from fedsv.settings.choices import ValuationMethod


def test_a_free_rider_is_refused_every_time_and_gets_nothing() -> None:
    """The global model sent back untrained under a false count of 10^7 (update_guard's unit tests cover
    noise and the other null updates)."""
    rider = "replay+count:10000000"
    config = DemoConfig(
        participants=6,
        fraction=0.5,
        rounds=4,
        seed=1,
        valuation=ValuationMethod.EXACT,
        validation_size=300,
        corrupt=f"3={rider}",
    )
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
