"""Coordinator metrics on an injected registry, and the HTTP endpoint serving them."""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from fedsv.pipeline.metrics import PHASES, RunMetrics, serve_metrics, stop_metrics
from tests.support.records import make_record

TOTALS = {
    "fedsv": {"p000": 0.03, "p001": 0.01},
    "fedsv_normalized": {"p000": 0.9, "p001": 0.3},
    "loo": {"p000": 0.02, "p001": 0.0},
    "loo_normalized": {"p000": 1.0, "p001": 0.0},
}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_every_family_after_a_round() -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    metrics.set_connected(3)
    metrics.record_rpc("SubmitUpdate", "up", 1000, messages=2)
    metrics.record_rpc("SubmitUpdate", "up", 500)
    metrics.record_rpc("Subscribe", "down", 2000)
    metrics.reject("too_large")
    metrics.reject("too_large")
    metrics.reject("stale_round")
    record = make_record(2)  # selected p000..p002, received p000, p001; 3000 bytes up, 4000 down
    metrics.observe_round(record, TOTALS)

    assert value(registry, "fedsv_current_round") == 2
    assert value(registry, "fedsv_rounds_completed_total") == 1
    assert value(registry, "fedsv_round_duration_seconds_count") == 1
    assert value(registry, "fedsv_round_duration_seconds_sum") == pytest.approx(1.5)
    assert value(registry, "fedsv_round_duration_seconds_bucket", le="2.5") == 1
    assert value(registry, "fedsv_round_duration_seconds_bucket", le="1.0") == 0
    seconds = {"train_wait": 1.2, "aggregation": 0.1, "valuation": 0.01, "evaluation": 0.2}
    for phase in PHASES:
        assert value(registry, "fedsv_phase_duration_seconds_count", phase=phase) == 1
        assert value(registry, "fedsv_phase_duration_seconds_sum", phase=phase) == pytest.approx(
            seconds[phase]
        )
    assert value(registry, "fedsv_global_accuracy") == pytest.approx(0.52)
    assert value(registry, "fedsv_global_loss") == pytest.approx(0.5)
    assert value(registry, "fedsv_participants_connected") == 3
    assert value(registry, "fedsv_participants_selected") == 3
    assert value(registry, "fedsv_participants_received") == 2
    assert value(registry, "fedsv_stragglers_total") == 1
    assert value(registry, "fedsv_updates_rejected_total", reason="too_large") == 2
    assert value(registry, "fedsv_updates_rejected_total", reason="stale_round") == 1
    assert value(registry, "fedsv_rpc_bytes_total", rpc="SubmitUpdate", direction="up") == 1500
    assert value(registry, "fedsv_rpc_messages_total", rpc="SubmitUpdate", direction="up") == 3
    assert value(registry, "fedsv_rpc_bytes_total", rpc="Subscribe", direction="down") == 2000
    assert value(registry, "fedsv_rpc_messages_total", rpc="Subscribe", direction="down") == 1
    assert value(registry, "fedsv_utility_evaluations_total") == 4
    assert value(registry, "fedsv_valuation_seconds_count") == 1
    assert value(registry, "fedsv_valuation_seconds_sum") == pytest.approx(0.01)
    assert value(registry, "fedsv_valuation_last_round_seconds") == pytest.approx(0.01)
    for pid in ("p000", "p001"):
        assert value(registry, "fedsv_participant_fedsv", participant=pid) == TOTALS["fedsv"][pid]
        norm = TOTALS["fedsv_normalized"][pid]
        assert value(registry, "fedsv_participant_fedsv_normalized", participant=pid) == norm
    assert value(registry, "fedsv_group_rationality_residual") == 0.0
    assert value(registry, "fedsv_round_bytes", direction="up") == 2000
    assert value(registry, "fedsv_round_bytes", direction="down") == 4000
    # physical minimum: 400 bytes x (3 selected down + 2 received up)
    assert value(registry, "fedsv_round_bytes_ratio_to_minimum") == pytest.approx(6000 / 2000)

    metrics.observe_round(make_record(3), {"fedsv": {"p000": 0.5}, "fedsv_normalized": {}})
    assert value(registry, "fedsv_rounds_completed_total") == 2
    assert value(registry, "fedsv_stragglers_total") == 2
    assert value(registry, "fedsv_current_round") == 3
    assert value(registry, "fedsv_participant_fedsv", participant="p000") == 0.5
    assert value(registry, "fedsv_round_duration_seconds_count") == 2


def test_look_alike_members_count_the_rounds_they_were_named_in() -> None:
    """Each round's look-alike groups (RoundValues.alike) count once per member, inline and pipelined."""
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    metrics.observe_round(make_record(1), TOTALS, alike=[["p000", "p001"]])
    metrics.observe_values(make_record(2), TOTALS, alike=[["p000", "p001"]])
    metrics.observe_round(make_record(3), TOTALS)
    name = "fedsv_participant_lookalike_rounds_total"
    assert value(registry, name, participant="p000") == value(registry, name, participant="p001") == 2
    assert value(registry, name, participant="p002") is None  # never named: no series


def test_registries_are_separate_and_never_the_global_default() -> None:
    first, second = RunMetrics(), RunMetrics()  # no duplicate-registration error
    first.observe_round(make_record(1), TOTALS)
    assert first.registry is not second.registry
    assert value(first.registry, "fedsv_rounds_completed_total") == 1
    assert value(second.registry, "fedsv_rounds_completed_total") == 0
    assert REGISTRY.get_sample_value("fedsv_current_round") is None


def test_restore_sets_gauges_and_leaves_counters() -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    metrics.restore([make_record(1), make_record(3), make_record(2)], TOTALS)
    assert value(registry, "fedsv_current_round") == 3
    assert value(registry, "fedsv_global_accuracy") == pytest.approx(0.53)
    assert value(registry, "fedsv_participant_fedsv", participant="p000") == 0.03
    assert value(registry, "fedsv_round_bytes", direction="down") == 6000
    assert value(registry, "fedsv_rounds_completed_total") == 0  # counters restart (a counter reset)
    assert value(registry, "fedsv_round_duration_seconds_count") == 0
    metrics.restore([], {})  # nothing recorded yet: nothing to set
    assert value(registry, "fedsv_current_round") == 3
    # a member no round selected (p009: in the totals at 0, as the accounting's world holds it) gets no gauge
    metrics.restore([make_record(1)], {key: {**v, "p009": 0.0} for key, v in TOTALS.items()})
    assert value(registry, "fedsv_participant_fedsv", participant="p009") is None


def test_serve_metrics_on_an_ephemeral_port() -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    metrics.observe_round(make_record(1), TOTALS)
    server, port = serve_metrics(registry, "127.0.0.1", 0)
    try:
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        expected = [
            "fedsv_current_round 1.0",
            "fedsv_rounds_completed_total 1.0",
            'fedsv_participant_fedsv{participant="p000"} 0.03',
            "fedsv_round_duration_seconds_bucket",
            "fedsv_round_bytes_ratio_to_minimum",
        ]
        assert [name for name in expected if name not in text] == []
    finally:
        stop_metrics(server)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_every_total_exports_its_standard_error() -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    record = make_record(1)  # received p000, p001
    errors = {"fedsv": {"p000": 0.004, "p001": float("inf")}}
    metrics.observe_round(dataclasses.replace(record, max_stderr=0.004), TOTALS, errors)
    assert value(registry, "fedsv_value_stderr", participant="p000") == 0.004
    assert value(registry, "fedsv_value_stderr", participant="p001") == float("inf")  # unknown
    assert value(registry, "fedsv_round_max_stderr") == 0.004
