"""Whole in-process runs (fedsv demo's rounds) under a participant that scales its delta a million-fold."""

from __future__ import annotations

import math
from typing import Any

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.settings.choices import Aggregation, NormPolicy, ValuationMethod


def test_a_participant_scaling_its_delta_by_a_million_neither_stops_nor_steers_the_run() -> None:
    settings = {
        "participants": 6,
        "fraction": 1.0,
        "rounds": 3,
        "epochs": 1,
        "validation_size": 300,
        "seed": 2,
    }
    honest = run_demo(DemoConfig(**settings, valuation="exact"))  # type: ignore[arg-type]
    attacked = run_demo(DemoConfig(**settings, valuation="exact", corrupt="3=scale:1e6"))  # type: ignore[arg-type]
    assert len(attacked.accuracies) == 3 and all(math.isfinite(a) for a in attacked.accuracies)
    assert abs(attacked.accuracies[-1] - honest.accuracies[-1]) <= 0.02
    # rejected (the default policy) every round: never aggregated, never valued
    assert all("p003" not in rv.participants for rv in attacked.valuation.per_round())
    clipped = run_demo(
        DemoConfig(**settings, valuation="exact", corrupt="3=scale:1e6", update_norm_policy="clip")  # type: ignore[arg-type]
    )
    assert abs(clipped.accuracies[-1] - honest.accuracies[-1]) <= 0.02
    totals = clipped.valuation.totals()["fedsv"]
    assert totals["p003"] <= min(v for pid, v in totals.items() if pid != "p003")


def test_median_keeps_a_million_fold_attacker_from_steering_the_run() -> None:
    settings: dict[str, Any] = {
        "participants": 6,
        "fraction": 1.0,
        "rounds": 3,
        "epochs": 1,
        "validation_size": 300,
        "seed": 2,
    }
    honest = run_demo(DemoConfig(**settings, valuation=ValuationMethod.NONE))
    attacked = run_demo(
        DemoConfig(
            **settings,
            valuation=ValuationMethod.NONE,
            corrupt="3=scale:1e6",
            update_norm_policy=NormPolicy.NONE,
            aggregation=Aggregation.MEDIAN,
        )
    )
    assert abs(attacked.accuracies[-1] - honest.accuracies[-1]) <= 0.05
