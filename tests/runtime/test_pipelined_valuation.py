"""Background valuation: a round committed as pending is valued later, in order, with the same values."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from fedsv.fl.evaluation import EvalSet
from fedsv.fl.state import params_of
from fedsv.fl.updates import ClientUpdate
from fedsv.ledger import Checkpoint, Ledger, LedgerError, RoundStatus, valuation_summary, value_rows
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.pending import PendingRound, PendingStore
from fedsv.pipeline.valuation_process import GivenSetup
from fedsv.pipeline.valuation_worker import ValuationWorker
from fedsv.task.models import build_model
from fedsv.valuation import FederatedValuation, Plan, ValuationSpec
from fedsv.valuation.round_valuation import GameSettings, value_updates
from tests.support.records import CONFIG, make_record, make_rows

PIDS = ["p000", "p001", "p002"]


def _round(number: int) -> PendingRound:
    """A round of three participants' deltas on the paper's MLP (seeded per round)."""
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = params_of(model)
    gen = torch.Generator().manual_seed(number)
    updates = [
        ClientUpdate(pid, {k: 0.05 * torch.randn(v.shape, generator=gen) for k, v in params.items()}, 10 + i)
        for i, pid in enumerate(PIDS)
    ]
    return PendingRound(number, params, updates)


INITIAL = [0.08, 0.11, 0.1, 0.12]
"""The validation scores of other initial models, as a coordinator records them when a run starts."""


def _validation() -> EvalSet:
    rng = np.random.default_rng(0)
    return EvalSet(rng.random((60, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, size=60))


def _spec(number: int) -> ValuationSpec:
    return ValuationSpec(method="exact", seed=number)


def _commit_pending(ledger: Ledger, number: int) -> None:
    record = make_record(number, PIDS, PIDS)
    pending = dataclasses.replace(record, status=RoundStatus.PENDING, method="", evaluations=0)
    _, traffic = make_rows(record)
    ledger.commit_round(pending, [], traffic, Checkpoint(number, b"w", "{}"))


def test_a_round_left_pending_by_a_kill_gets_the_same_values_from_a_new_worker(tmp_path: Path) -> None:
    model, validation = build_model("mlp", (1, 28, 28), seed=0), _validation()
    # What inline valuation gives for rounds 1 and 2.
    inline = FederatedValuation(initial_scores=INITIAL)
    expected = [value_updates(model, r.params, r.updates, validation, r.round, _spec(r.round), inline)
                for r in (_round(1), _round(2))]  # fmt: skip
    # A coordinator committed both rounds as pending, their inputs on disk, and died.
    store = PendingStore(tmp_path / "pending")
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", CONFIG)
        for number in (1, 2):
            store.save(_round(number))
            _commit_pending(ledger, number)
        assert ledger.pending_rounds() == [1, 2]
        # Values must come in round order.
        early = expected[1]
        with pytest.raises(LedgerError, match="not the first round awaiting values"):
            ledger.commit_values(2, value_rows(early), valuation_summary(early, 0.0))
        # The restarted coordinator: a new worker values the backlog from the files.
        metrics = RunMetrics(CollectorRegistry())
        accounting = FederatedValuation(initial_scores=INITIAL)  # as resume() reads them from the ledger
        worker = ValuationWorker(
            GivenSetup(model, validation), GameSettings(), _spec, accounting, ledger, metrics, store
        )
        for number in ledger.pending_rounds():
            worker.submit(number)
        assert worker.drain(threading.Event()), worker.error
        assert worker.settle(threading.Event()), worker.error  # caught up: the values completed too
        worker.close()
        assert ledger.pending_rounds() == [] and not list(store.directory.glob("round-*.pt"))
        rows, records = ledger.values(), ledger.rounds()
    for values, record in zip(expected, records, strict=True):
        got = [r for r in rows if r.round == values.round]
        assert [r.participant for r in got] == PIDS
        np.testing.assert_array_equal([r.fedsv for r in got], values.fedsv)  # bit-identical
        assert record.method == "exact" and record.evaluations == values.evaluations
        assert record.utility_after == values.utility_after and not math.isnan(record.valued_at)
    assert accounting.totals() == inline.totals()
    registry = metrics.registry
    assert registry.get_sample_value("fedsv_valuation_queue_depth") == 0
    assert registry.get_sample_value("fedsv_valuation_lag_rounds") == 0
    assert registry.get_sample_value("fedsv_utility_evaluations_total") == sum(
        v.evaluations for v in expected
    )
    # caught up, the valuation process completed the values: here everyone was in every round
    for pid in PIDS:
        completed = registry.get_sample_value("fedsv_participant_fedsv_completed", {"participant": pid})
        assert completed == pytest.approx(accounting.totals()["fedsv"][pid], abs=1e-12)
        # its error against a rerun (the validation folds', the training's), the same as the report's
        error = registry.get_sample_value("fedsv_participant_fedsv_completed_stderr", {"participant": pid})
        assert error is not None and error > 0
        assert error == pytest.approx(accounting.errors()["fedsv_completed"][pid])
        rerun = registry.get_sample_value("fedsv_value_rerun_stderr", {"participant": pid, "value": "fedsv"})
        assert rerun == pytest.approx(accounting.errors()["fedsv"][pid])
    assert (registry.get_sample_value("fedsv_completion_seconds") or -1) >= 0


def test_a_failed_valuation_stops_the_worker_and_leaves_the_round_pending(tmp_path: Path) -> None:
    model, validation = build_model("mlp", (1, 28, 28), seed=0), _validation()
    store = PendingStore(tmp_path / "pending")
    good = _round(1)
    wrong = ClientUpdate("p000", {"no.such.weight": torch.zeros(2)}, 10)  # names the model does not have
    broken = PendingRound(1, good.params, [wrong, *good.updates[1:]])
    store.save(broken)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", CONFIG)
        _commit_pending(ledger, 1)
        metrics = RunMetrics(CollectorRegistry())
        worker = ValuationWorker(
            GivenSetup(model, validation), GameSettings(), _spec, FederatedValuation(), ledger, metrics, store
        )
        worker.submit(1)
        assert not worker.drain(threading.Event())
        assert "valuation of round 1 failed" in worker.error
        assert not worker.wait_for_room(threading.Event())  # the round loop stops instead of waiting
        worker.close()
        assert ledger.pending_rounds() == [1] and store.path(1).is_file()  # nothing lost


def test_the_store_keeps_inputs_exactly_and_prunes_others(tmp_path: Path) -> None:
    store = PendingStore(tmp_path)
    original = _round(3)
    store.save(original)
    store.save(_round(4))
    loaded = store.load(3)
    assert [u.participant for u in loaded.updates] == PIDS and [u.num_samples for u in loaded.updates] == [
        10,
        11,
        12,
    ]
    for a, b in zip(original.updates, loaded.updates, strict=True):
        assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)
    store.prune(keep={4})
    assert not store.path(3).exists() and store.path(4).exists()
    with pytest.raises(ValueError, match="is missing"):
        store.load(3)
    store.path(5).write_bytes(b"torn")
    with pytest.raises(ValueError, match="cannot read"):
        store.load(5)


def test_a_time_budgeted_round_is_valued_again_with_the_plan_it_had(tmp_path: Path) -> None:
    """The time budget makes the plan depend on the machine: a restart replays the kept plan instead."""
    model, validation = build_model("mlp", (1, 28, 28), seed=0), _validation()

    def timed_spec(number: int) -> ValuationSpec:
        return ValuationSpec(method="auto", seed=number, budget_seconds=60.0)  # would be exact here

    kept = Plan(players=3, requested="auto", method="permutation", evaluations=5, seconds_per_evaluation=0.02)
    expected = value_updates(
        model,
        _round(1).params,
        _round(1).updates,
        validation,
        1,
        kept.replay(timed_spec(1)),
        FederatedValuation(),
    )
    store = PendingStore(tmp_path / "pending")
    store.save(_round(1))
    store.save_plan(1, kept)  # the first coordinator planned round 1, then was killed
    assert store.load_plan(1) == kept
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", CONFIG)
        _commit_pending(ledger, 1)
        worker = ValuationWorker(
            GivenSetup(model, validation),
            GameSettings(),
            timed_spec,
            FederatedValuation(),
            ledger,
            RunMetrics(CollectorRegistry()),
            store,
        )
        worker.submit(1)
        assert worker.drain(threading.Event()), worker.error
        worker.close()
        (record,), rows = ledger.rounds(), ledger.values()
    assert record.method == "permutation" and record.evaluations == expected.evaluations
    np.testing.assert_array_equal([r.fedsv for r in rows], expected.fedsv)
    assert not store.plan_path(1).exists() and not store.path(1).exists()  # dropped with the inputs


def test_the_worker_keeps_a_plan_while_it_values_and_a_torn_plan_is_planned_anew(tmp_path: Path) -> None:
    store = PendingStore(tmp_path)
    seen: list[Plan | None] = []

    def keep(plan: Plan) -> None:  # what the worker does, then a look at what was kept
        store.save_plan(number, plan)
        seen.append(store.load_plan(number))

    model, validation, number = build_model("mlp", (1, 28, 28), seed=0), _validation(), 2
    pending = _round(number)
    spec = ValuationSpec(budget_seconds=60.0, seed=number)
    value_updates(
        model,
        pending.params,
        pending.updates,
        validation,
        number,
        spec,
        FederatedValuation(),
        on_plan=keep,
    )
    assert seen and seen[0] is not None and seen[0].method == "exact" and seen[0].seconds_per_evaluation
    store.plan_path(number).write_text("{torn")
    assert store.load_plan(number) is None
    store.prune(keep=set())
    assert not store.plan_path(number).exists()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_rounds_are_valued_by_an_idle_priority_process_and_wait_only_on_a_full_backlog(
    tmp_path: Path,
) -> None:
    model, validation = build_model("mlp", (1, 28, 28), seed=0), _validation()
    store = PendingStore(tmp_path / "pending")
    stop, stopped = threading.Event(), threading.Event()
    stopped.set()
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", CONFIG)
        metrics = RunMetrics(CollectorRegistry())
        store.save(_round(1))
        _commit_pending(ledger, 1)
        size = store.size(1)
        setup, accounting = GivenSetup(model, validation), FederatedValuation()
        worker = ValuationWorker(
            setup,
            GameSettings(),
            _spec,
            accounting,
            ledger,
            metrics,
            store,
            backlog_bytes=size + 1,
            threads=1,
        )
        try:
            assert worker.wait_for_room(stop)  # nothing waiting: room
            worker.submit(1)
            assert worker.outstanding_bytes == size
            assert worker.wait_for_room(stop)  # below the bound: rounds go on while round 1 waits
            store.save(_round(2))
            _commit_pending(ledger, 2)
            worker.submit(2)  # two rounds' inputs are over the bound: the next round would wait
            assert not worker.wait_for_room(stopped)
            assert (metrics.registry.get_sample_value("fedsv_valuation_backlog_bytes") or 0) >= size
            assert worker.drain(stop), worker.error
            assert worker.wait_for_room(stop) and worker.outstanding_bytes == 0
            pid = worker.process_pid
            assert pid is not None and os.sched_getscheduler(pid) == os.SCHED_IDLE
            autogroup = Path(f"/proc/{pid}/autogroup")
            if autogroup.exists():  # a session of its own, its autogroup at nice 19: idle against others
                assert os.getsid(pid) == pid and autogroup.read_text().strip().endswith("nice 19")
        finally:
            worker.close()
        assert ledger.pending_rounds() == []
        errors = [r.fedsv_stderr for r in ledger.values()]
    assert errors and all(e == 0.0 for e in errors)  # exact rounds: no error
