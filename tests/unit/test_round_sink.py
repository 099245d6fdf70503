"""The pipeline's RoundSink: one commit path for every engine (ledger, then metrics), a ledger optional."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from fedsv.ledger import Checkpoint, EffectRow, Ledger, UpdateRow
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.round_sink import RoundSink
from fedsv.valuation import FederatedValuation, RoundValues
from tests.support.records import CONFIG, make_record, make_rows


def test_a_valued_round_and_a_pending_one_reach_the_ledger_and_the_metrics(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    accounting = FederatedValuation(["p000", "p001", "p002"])
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", CONFIG)
        sink = RoundSink(ledger, RunMetrics(registry), accounting)
        record = make_record(1)
        _, traffic = make_rows(record)
        values = RoundValues(1, record.received, np.array([0.03, 0.02]), np.array([0.01, 0.0]), 0.1, 0.15,
                             "exact", 4, 0.01, alike=[["p000", "p001"]])  # fmt: skip
        accounting.add_round(values)
        effects = [EffectRow(1, "p000", -0.01, 0.001, True), EffectRow(1, "p002", 0.2, 0.01, False)]
        updates = [UpdateRow(1, pid, 10, 0.5) for pid in record.received]
        sink.commit(record, values, traffic, Checkpoint(1, b"w", "{}"), updates, effects)
        assert [r.fedsv for r in ledger.values()] == [0.03, 0.02] and ledger.effects() == effects
        fedsv = registry.get_sample_value("fedsv_participant_fedsv", {"participant": "p000"})
        assert fedsv == 0.03
        assert [r.alike for r in ledger.values()] == ["p000", "p000"]  # the look-alikes, named
        named = [
            registry.get_sample_value("fedsv_participant_lookalike_rounds_total", {"participant": pid})
            for pid in ("p000", "p001", "p002")
        ]
        assert named == [1, 1, None]
        sink.commit(make_record(2), None, [], Checkpoint(2, b"w", "{}"), [])  # its values follow
        assert [r.round for r in ledger.rounds()] == [1, 2] and len(ledger.values()) == 2
        assert registry.get_sample_value("fedsv_rounds_completed_total") == 2


def test_without_a_ledger_a_round_reaches_the_metrics_and_with_one_it_needs_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a file the sink wrote without a ledger, by any relative path, lands here
    registry = CollectorRegistry()
    accounting = FederatedValuation(["p000", "p001", "p002"])
    record = make_record(1)
    values = RoundValues(1, record.received, np.array([0.03, 0.02]), np.array([0.01, 0.0]), 0.1, 0.15,
                         "exact", 4, 0.01)  # fmt: skip
    accounting.add_round(values)
    RoundSink(None, RunMetrics(registry), accounting).commit(record, values, [], None, [])  # no checkpoint
    assert registry.get_sample_value("fedsv_rounds_completed_total") == 1
    assert registry.get_sample_value("fedsv_participant_fedsv", {"participant": "p000"}) == 0.03
    assert not list(tmp_path.iterdir())  # nothing written in the working directory
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", CONFIG)
        with pytest.raises(ValueError, match="needs the round's checkpoint"):
            RoundSink(ledger, None, accounting).commit(make_record(2), None, [], None, [])
        assert ledger.rounds() == []  # the round refused is not half-recorded
