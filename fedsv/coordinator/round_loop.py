"""The coordinator's round loop: select, dispatch, collect, aggregate, value, evaluate, record."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path

import numpy as np
from torch import Tensor

from fedsv.coordinator.config import RunConfig, ServerConfig
from fedsv.coordinator.metrics import CoordinatorMetrics
from fedsv.coordinator.pending import PendingRound, PendingStore
from fedsv.coordinator.round_step import step_round
from fedsv.coordinator.run_inputs import RunInputs
from fedsv.coordinator.run_state import OpenRound, RunState
from fedsv.coordinator.valuation_worker import ValuationWorker
from fedsv.fl.aggregation import aggregate
from fedsv.fl.evaluation import evaluate
from fedsv.fl.ranks import participant_id
from fedsv.fl.selection import select_ranks, train_seed
from fedsv.fl.state import params_of
from fedsv.fl.update_bounds import bound_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.ledger import (
    Checkpoint,
    Ledger,
    RoundRecord,
    RoundTimes,
    TestScore,
    TrafficRow,
    UpdateRow,
    build_round_record,
    decode_params,
    encode_params,
    federated_valuation,
    value_rows,
)
from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.round_valuation import GameSettings
from fedsv.wire.codec import encode_tensor_set
from fedsv.wire.v1 import fedsv_pb2

logger = logging.getLogger(__name__)


class PhaseClock:
    """Wall-clock seconds of a round's consecutive phases."""

    def __init__(self) -> None:
        self.started = self._last = time.time()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.time()
        self.phases[phase] = now - self._last
        self._last = now


class RoundLoop:
    """Runs the rounds of one run; resumes from the ledger's checkpoint after a restart."""

    def __init__(
        self,
        run: RunConfig,
        server: ServerConfig,
        state: RunState,
        ledger: Ledger,
        metrics: CoordinatorMetrics,
        inputs: RunInputs,
    ) -> None:
        self.run_config, self.server_config = run, server
        self.state, self.ledger, self.metrics = state, ledger, metrics
        self.stop_event = threading.Event()
        self.task, self.model = inputs.task, inputs.model
        self.validation, self.test = inputs.validation, inputs.test
        self.game_settings = GameSettings(
            self.task.metric, server.valuation_device, server.valuation_precision, run.aggregation_rule()
        )
        self.params = params_of(self.model)
        self.rng = np.random.default_rng(run.seed)
        self.schedule = run.schedule()
        self.accounting = FederatedValuation()
        self.completed = 0
        self.store = PendingStore(Path(server.state_dir) / "pending")
        self.backlog: list[PendingRound] = []  # rounds committed before a restart, not yet valued
        self.worker: ValuationWorker | None = None
        self._resume()

    # ------------------------------------------------------------------ restart
    def _resume(self) -> None:
        checkpoint = self.ledger.last_checkpoint()
        if checkpoint is None:
            return
        self.params = decode_params(checkpoint.global_params)
        self.rng.bit_generator.state = json.loads(checkpoint.rng_state)
        self.completed = checkpoint.round
        records = self.ledger.rounds()
        self.accounting = federated_valuation(records, self.ledger.values())
        self.metrics.restore(records, self.accounting.totals())
        pending = self.ledger.pending_rounds()
        self.store.prune(keep=set(pending))  # inputs of rounds valued already, or never committed
        self.backlog = [self.store.load(number) for number in pending]  # ValueError: inputs lost
        logger.info(
            "resumed after round %d from the ledger's checkpoint; %d rounds await their values",
            self.completed,
            len(pending),
        )

    # ------------------------------------------------------------------ loop
    def run(self) -> str:
        """Run the remaining rounds; returns the end reason ("finished" or why it stopped).

        With pipelined valuation the run is finished once every round also has its values: the
        participants are released after the last round, then the backlog is valued.
        """
        if self.server_config.valuation_schedule == "pipelined" and self.run_config.valuation != "none":
            self.worker = ValuationWorker(
                self.model,
                self.validation,
                self.game_settings,
                self.run_config.valuation_spec,
                self.accounting,
                self.ledger,
                self.metrics,
                self.store,
                self.server_config.valuation_queue,
            )
            for pending in self.backlog:
                self.worker.submit(pending)
        try:
            reason = self._rounds()
            self.state.finish(reason, self.completed)
            if reason == "finished" and self.worker is not None and not self.worker.drain(self.stop_event):
                reason = "stopped" if self.stop_event.is_set() else f"stopped: {self.worker.error}"
            return reason
        finally:
            if self.worker is not None:
                self.worker.close()

    def _rounds(self) -> str:
        run = self.run_config
        if self.completed >= run.rounds:
            return "finished"
        if not self._wait_for_participants():
            return "stopped" if self.stop_event.is_set() else "stopped: participants did not join in time"
        for number in range(self.completed + 1, run.rounds + 1):
            reason = self._round(number)
            if reason:
                return reason
        return "finished"

    def _wait_for_participants(self) -> bool:
        """Until every participant holds a task stream (or, under a lower --max-participants, as many as
        may); False at join_timeout or on stop."""
        deadline = time.time() + self.server_config.join_timeout
        count = min(self.run_config.participants, self.state.max_participants)
        return self.state.wait_for_participants(count, deadline, self.stop_event)

    def _select(self, number: int) -> list[int]:
        """The ranks of the seeded draw of m participants, or the round's entry of a fixed `selection`."""
        run = self.run_config
        return select_ranks(self.rng, run.participants, run.selected_per_round, self.schedule.get(number))

    def _collect(self, opened: OpenRound) -> bool:
        """Wait until all selected reported or the deadline passed; then until a quorum, if short of one."""
        need = max(1, int(np.ceil(self.server_config.quorum * len(opened.selected))))
        hard_deadline = opened.deadline + self.server_config.quorum_wait
        return self.state.wait_for_updates(opened, need, hard_deadline, self.stop_event)

    def _round(self, number: int) -> str:
        run = self.run_config
        clock = PhaseClock()  # a round's time includes any wait for the valuation backlog to shrink
        if self.worker is not None and not self.worker.wait_for_room(self.stop_event):
            return "stopped" if self.stop_event.is_set() else f"stopped: {self.worker.error}"
        clock.lap("backlog")
        # Only the selected cost work here: a connected participant that is not selected is not
        # looked at (its task stream stays parked until it is selected or the run ends).
        ranks = self._select(number)
        selected = [participant_id(r) for r in ranks]
        header, payloads = encode_tensor_set(self.params, chunk_bytes=self.server_config.max_chunk_bytes)
        seeds = {participant_id(r): train_seed(run.seed, number, r) for r in ranks}
        deadline = time.time() + self.server_config.round_timeout
        opened = OpenRound(number, selected, deadline, header, payloads, seeds)
        self.metrics.current_round.set(number)
        self.metrics.participants_selected.set(len(selected))
        self.state.open_round(opened)
        logger.info("round %d: selected %s", number, selected)
        if not self._collect(opened):
            self.state.close_round()
            return "stopped" if self.stop_event.is_set() else f"stopped: no quorum in round {number}"
        closed = self.state.close_round()
        clock.lap("train_wait")
        updates = self._bounded(closed)
        if not updates:
            return f"stopped: every update of round {number} was over the norm bound"
        if self.worker is None:  # inline: aggregate and value before the next round
            outcome = step_round(
                self.model,
                self.params,
                updates,
                self.validation,
                number,
                run.valuation_spec(number),
                self.accounting,
                self.game_settings,
            )
            new_params, values = outcome.params, outcome.values
            aggregation, valuation = outcome.aggregation_seconds, outcome.valuation_seconds
        else:  # pipelined: the worker values this round while the next one trains
            started = time.perf_counter()
            new_params, values = aggregate(self.params, updates, number, self.game_settings.aggregation), None
            aggregation, valuation = time.perf_counter() - started, 0.0
        clock.lap("aggregation_and_valuation")  # split by the timings above
        accuracy, loss = math.nan, math.nan  # no test set: nothing to report
        if self.test is not None:
            accuracy, loss = evaluate(self.model, new_params, self.test.x, self.test.y)
        clock.lap("evaluation")
        pending = PendingRound(number, self.params, updates) if values is None else None
        timings = (aggregation, valuation)
        self._record(closed, new_params, values, timings, accuracy, loss, header, clock, pending)
        if pending is not None and self.worker is not None:
            self.worker.submit(pending)
        self.params = new_params
        self.completed = number
        return ""

    def _bounded(self, closed: OpenRound) -> list[ClientUpdate]:
        """The round's updates after the norm bound; a rejected one no longer counts as received."""
        bounded = bound_updates(list(closed.received.values()), self.run_config.norm_bound())
        for pid in bounded.rejected:
            del closed.received[pid]
        actions = [(p, "norm_clipped") for p in bounded.clipped]
        actions += [(p, "norm_rejected") for p in bounded.rejected]
        for pid, reason in actions:
            self.metrics.reject(reason)
            logger.warning(
                "round %d: %s's update has norm %.4g, over the bound %.4g: %s",
                closed.round,
                pid,
                bounded.norms[pid],
                bounded.bound,
                "clipped" if reason == "norm_clipped" else "rejected",
            )
        return bounded.updates

    def _record(
        self,
        closed: OpenRound,
        new_params: dict[str, Tensor],
        values: RoundValues | None,
        seconds: tuple[float, float],
        accuracy: float,
        loss: float,
        header: fedsv_pb2.TensorSetHeader,
        clock: PhaseClock,
        pending: PendingRound | None,
    ) -> RoundRecord:
        """Commit the round, its values (unless pending), traffic and checkpoint in one transaction.

        A pending round's valuation inputs are on disk before the ledger calls it pending.
        """
        number = closed.round
        traffic = self.state.take_traffic(number)
        traffic_rows = [TrafficRow(number, rpc, d, b, m) for (rpc, d), (b, m) in sorted(traffic.items())]
        times = RoundTimes(
            started_at=clock.started,
            finished_at=time.time(),
            train_wait=clock.phases["train_wait"],
            aggregation=seconds[0],
            valuation=seconds[1],
            evaluation=clock.phases["evaluation"],
            local_train=max((u.train_seconds for u in closed.received.values()), default=0.0),
        )
        record = build_round_record(
            number,
            closed.selected,
            list(closed.received),
            values,
            traffic_rows,
            header.total_bytes,
            times,
            TestScore(accuracy, loss),
        )
        checkpoint = Checkpoint(number, encode_params(new_params), json.dumps(self.rng.bit_generator.state))
        updates = [
            UpdateRow(number, u.participant, u.num_samples, u.train_seconds)
            for u in sorted(closed.received.values(), key=lambda u: u.participant)
        ]
        if pending is not None:
            self.store.save(pending)
        self.ledger.commit_round(
            record, [] if values is None else value_rows(values), traffic_rows, checkpoint, updates
        )
        if values is None:
            self.metrics.observe_training(record)
        else:
            self.metrics.observe_round(record, self.accounting.totals())
        logger.info(
            "round %d done: received %d/%d, accuracy %.4f, valuation %s %.2fs",
            number,
            len(record.received),
            len(record.selected),
            accuracy,
            record.method,
            record.valuation_seconds,
        )
        return record
