"""The coordinator's round loop: select, dispatch, collect, aggregate, value, evaluate, record."""

from __future__ import annotations

import io
import json
import logging
import math
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.common.ranks import participant_id
from fedsv.common.round_step import EvalSet, RoundOutcome, select_ranks, step_round, train_seed
from fedsv.common.task import LoadedTask
from fedsv.common.task_data import evaluation_samples
from fedsv.common.training import evaluate, params_of
from fedsv.common.wire import encode_tensor_set
from fedsv.coordinator.config import RunConfig, ServerConfig
from fedsv.coordinator.ledger import Checkpoint, Ledger, RoundRecord, TrafficRow, UpdateRow
from fedsv.coordinator.metrics import CoordinatorMetrics
from fedsv.coordinator.records import federated_valuation, value_rows
from fedsv.coordinator.run_state import OpenRound, RunState
from fedsv.valuation import FederatedValuation

logger = logging.getLogger(__name__)


def params_to_bytes(params: dict[str, Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(params, buffer)
    return buffer.getvalue()


def params_from_bytes(blob: bytes) -> dict[str, Tensor]:
    loaded = torch.load(io.BytesIO(blob), weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError("checkpoint does not hold a parameter dictionary")
    return loaded


class PhaseClock:
    """Wall-clock seconds of a round's consecutive phases."""

    def __init__(self) -> None:
        self.started = self._last = time.time()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.time()
        self.phases[phase] = now - self._last
        self._last = now


@dataclass(frozen=True)
class RunInputs:
    """What the coordinator's side of a run is made of: the task, w_0's model, validation and test sets."""

    task: LoadedTask
    model: nn.Module
    validation: EvalSet
    test: EvalSet | None

    @classmethod
    def load(cls, run: RunConfig) -> RunInputs:
        """Import the task, build the model and read the data; a bad task or file raises ValueError."""
        task = run.load_task()
        model = task.build_model(run.seed)
        validation = evaluation_samples(task, run.validation_source, "validation", run.simulation())
        test = None
        if run.test_source:
            samples = evaluation_samples(task, run.test_source, "test", run.simulation())
            test = EvalSet(samples.x, samples.y)
        return cls(task, model, EvalSet(validation.x, validation.y), test)


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
        self.params = params_of(self.model)
        self.rng = np.random.default_rng(run.seed)
        self.schedule = run.schedule()
        self.accounting = FederatedValuation()
        self.completed = 0
        self._resume()

    # ------------------------------------------------------------------ restart
    def _resume(self) -> None:
        checkpoint = self.ledger.last_checkpoint()
        if checkpoint is None:
            return
        self.params = params_from_bytes(checkpoint.global_params)
        self.rng.bit_generator.state = json.loads(checkpoint.rng_state)
        self.completed = checkpoint.round
        records = self.ledger.rounds()
        self.accounting = federated_valuation(records, self.ledger.values())
        self.metrics.restore(records, self.accounting.totals())
        logger.info("resumed after round %d from the ledger's checkpoint", self.completed)

    # ------------------------------------------------------------------ loop
    def run(self) -> str:
        """Run the remaining rounds; returns the end reason ("finished" or why it stopped)."""
        run = self.run_config
        if self.completed >= run.rounds:
            self.state.finish("finished", self.completed)
            return "finished"
        if not self._wait_for_participants():
            reason = "stopped" if self.stop_event.is_set() else "stopped: participants did not join in time"
            self.state.finish(reason, self.completed)
            return reason
        for number in range(self.completed + 1, run.rounds + 1):
            reason = self._round(number)
            if reason:
                self.state.finish(reason, self.completed)
                return reason
        self.state.finish("finished", self.completed)
        return "finished"

    def _wait_for_participants(self) -> bool:
        deadline = time.time() + self.server_config.join_timeout
        return self.state.wait_for_participants(self.run_config.participants, deadline, self.stop_event)

    def _select(self, number: int) -> list[str]:
        """The seeded draw of m participants, or the round's entry of a fixed `selection`."""
        run = self.run_config
        ranks = select_ranks(self.rng, run.participants, run.selected_per_round, self.schedule.get(number))
        return [participant_id(r) for r in ranks]

    def _collect(self, opened: OpenRound) -> bool:
        """Wait until all selected reported or the deadline passed; then until a quorum, if short of one."""
        need = max(1, int(np.ceil(self.server_config.quorum * len(opened.selected))))
        hard_deadline = opened.deadline + self.server_config.quorum_wait
        return self.state.wait_for_updates(opened, need, hard_deadline, self.stop_event)

    def _round(self, number: int) -> str:
        run = self.run_config
        clock = PhaseClock()
        selected = self._select(number)
        header, payloads = encode_tensor_set(self.params, chunk_bytes=self.server_config.max_chunk_bytes)
        seeds = {participant_id(r): train_seed(run.seed, number, r) for r in range(run.participants)}
        deadline = clock.started + self.server_config.round_timeout
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
        outcome = step_round(
            self.model,
            self.params,
            list(closed.received.values()),
            self.validation,
            number,
            run.valuation_spec(number),
            self.accounting,
            metric=self.task.metric,
        )
        clock.lap("aggregation_and_valuation")  # split by the outcome's own timings
        accuracy, loss = math.nan, math.nan  # no test set: nothing to report
        if self.test is not None:
            accuracy, loss = evaluate(self.model, outcome.params, self.test.x, self.test.y)
        clock.lap("evaluation")
        self._record(closed, outcome, accuracy, loss, header.total_bytes, clock)
        self.params = outcome.params
        self.completed = number
        return ""

    def _record(
        self,
        closed: OpenRound,
        outcome: RoundOutcome,
        accuracy: float,
        loss: float,
        model_bytes: int,
        clock: PhaseClock,
    ) -> None:
        """Commit the round, its values, its traffic and the checkpoint in one ledger transaction."""
        number = closed.round
        traffic = self.state.take_traffic(number)
        traffic_rows = [TrafficRow(number, rpc, d, b, m) for (rpc, d), (b, m) in sorted(traffic.items())]
        up = [(b, m) for (_, d), (b, m) in traffic.items() if d == "up"]
        down = [(b, m) for (_, d), (b, m) in traffic.items() if d == "down"]
        values = outcome.values
        finished = time.time()
        record = RoundRecord(
            round=number,
            selected=closed.selected,
            received=sorted(closed.received),
            stragglers=[p for p in closed.selected if p not in closed.received],
            utility_before=values.utility_before,
            utility_after=values.utility_after,
            test_accuracy=accuracy,
            test_loss=loss,
            method=values.method,
            evaluations=values.evaluations,
            valuation_seconds=outcome.valuation_seconds,
            round_seconds=finished - clock.started,
            train_wait_seconds=clock.phases["train_wait"],
            aggregation_seconds=outcome.aggregation_seconds,
            evaluation_seconds=clock.phases["evaluation"],
            bytes_up=sum(b for b, _ in up),
            bytes_down=sum(b for b, _ in down),
            messages_up=sum(m for _, m in up),
            messages_down=sum(m for _, m in down),
            model_bytes=model_bytes,
            group_rationality_residual=values.group_rationality_residual,
            started_at=clock.started,
            finished_at=finished,
            local_train_seconds=max((u.train_seconds for u in closed.received.values()), default=0.0),
        )
        checkpoint = Checkpoint(
            number, params_to_bytes(outcome.params), json.dumps(self.rng.bit_generator.state)
        )
        updates = [
            UpdateRow(number, u.participant, u.num_samples, u.train_seconds)
            for u in sorted(closed.received.values(), key=lambda u: u.participant)
        ]
        self.ledger.commit_round(record, value_rows(values), traffic_rows, checkpoint, updates)
        self.metrics.observe_round(record, self.accounting.totals())
        logger.info(
            "round %d done: received %d/%d, accuracy %.4f, valuation %s %.2fs",
            number,
            len(record.received),
            len(record.selected),
            accuracy,
            values.method,
            record.valuation_seconds,
        )
