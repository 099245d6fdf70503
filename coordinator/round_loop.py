"""The coordinator's round loop: select, dispatch, collect, aggregate, value, evaluate, record."""

from __future__ import annotations

import io
import json
import logging
import threading
import time

import numpy as np
import torch
from torch import Tensor

from fedsv.common.data import load_dataset
from fedsv.common.models import build_model
from fedsv.common.ranks import participant_id
from fedsv.common.training import apply_delta, evaluate, fedavg, params_of
from fedsv.common.wire import encode_tensor_set
from fedsv.coordinator.config import RunConfig, ServerConfig
from fedsv.coordinator.ledger import Checkpoint, Ledger, RoundRecord, TrafficRow, ValueRow
from fedsv.coordinator.metrics import CoordinatorMetrics
from fedsv.coordinator.run_state import OpenRound, RunState
from fedsv.valuation import FederatedValuation, RoundGame, RoundValues
from fedsv.valuation.rounds import normalized

logger = logging.getLogger(__name__)


def train_seed(seed: int, round_number: int, rank: int) -> int:
    """The seed of a rank's local training in a round (sent with the task)."""
    return seed * 1_000_003 + round_number * 1009 + rank


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


class RoundLoop:
    """Runs the rounds of one run; resumes from the ledger's checkpoint after a restart."""

    def __init__(
        self,
        run: RunConfig,
        server: ServerConfig,
        state: RunState,
        ledger: Ledger,
        metrics: CoordinatorMetrics,
    ) -> None:
        self.run_config, self.server_config = run, server
        self.state, self.ledger, self.metrics = state, ledger, metrics
        self.stop_event = threading.Event()
        splits = load_dataset(
            run.dataset, run.data_dir or None, seed=run.seed, validation_size=run.validation_size
        )
        self.validation, self.test = splits.validation, splits.test
        self.model = build_model(run.model, splits.input_shape, splits.num_classes, seed=run.seed)
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
        records = {r.round: r for r in self.ledger.rounds()}
        by_round: dict[int, list[ValueRow]] = {}
        for row in self.ledger.values():
            by_round.setdefault(row.round, []).append(row)
        for number, rows in sorted(by_round.items()):
            record = records[number]
            self.accounting.add_round(
                RoundValues(
                    round=number,
                    participants=[r.participant for r in rows],
                    fedsv=np.array([r.fedsv for r in rows]),
                    loo=np.array([r.loo for r in rows]),
                    utility_before=record.utility_before,
                    utility_after=record.utility_after,
                    method=record.method,
                    evaluations=record.evaluations,
                    seconds=record.valuation_seconds,
                )
            )
        self.metrics.restore(list(records.values()), self.accounting.totals())
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
        with self.state.cond:
            while self.state.connected() < self.run_config.participants:
                if self.stop_event.is_set() or time.time() > deadline:
                    return False
                self.state.cond.wait(timeout=0.5)
        return True

    def _select(self, number: int) -> list[str]:
        """The seeded draw of m participants, or the round's entry of a fixed `selection`."""
        run = self.run_config
        ranks = sorted(
            int(r) for r in self.rng.choice(run.participants, size=run.selected_per_round, replace=False)
        )
        fixed = self.schedule.get(number)
        return [participant_id(r) for r in (fixed if fixed is not None else ranks)]

    def _collect(self, opened: OpenRound) -> bool:
        """Wait until all selected reported or the deadline passed; then until a quorum, if short of one."""
        need = max(1, int(np.ceil(self.server_config.quorum * len(opened.selected))))
        hard_deadline = opened.deadline + self.server_config.quorum_wait
        with self.state.cond:
            while not self.stop_event.is_set():
                got = len(opened.received)
                now = time.time()
                if got == len(opened.selected) or (now > opened.deadline and got >= need):
                    return True
                if now > hard_deadline:
                    return False
                self.state.cond.wait(timeout=0.2)
        return False

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
        received = sorted(closed.received)
        deltas = [closed.received[p][0] for p in received]
        counts = [closed.received[p][1] for p in received]
        new_params = apply_delta(self.params, fedavg(deltas, counts))
        clock.lap("aggregation")
        values = self._value(number, received, deltas, counts, new_params)
        clock.lap("valuation")
        accuracy, loss = evaluate(self.model, new_params, self.test.x, self.test.y)
        clock.lap("evaluation")
        self._record(closed, values, new_params, accuracy, loss, header.total_bytes, clock)
        self.params = new_params
        self.completed = number
        return ""

    def _value(
        self,
        number: int,
        ids: list[str],
        deltas: list[dict[str, Tensor]],
        counts: list[int],
        new_params: dict[str, Tensor],
    ) -> RoundValues:
        run = self.run_config
        if run.valuation == "none":
            before, _ = evaluate(self.model, self.params, self.validation.x, self.validation.y)
            after, _ = evaluate(self.model, new_params, self.validation.x, self.validation.y)
            zeros = np.zeros(len(ids))
            return RoundValues(number, ids, zeros, zeros.copy(), before, after, "none", 2, 0.0)
        game = RoundGame(self.model, self.params, deltas, counts, self.validation.x, self.validation.y)
        return self.accounting.value_round(
            game, ids, number, method=run.valuation, eps=run.eps, delta=run.delta, seed=run.seed + number
        )

    def _record(
        self,
        closed: OpenRound,
        values: RoundValues,
        new_params: dict[str, Tensor],
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
        fedsv_norm, loo_norm = normalized(values.fedsv), normalized(values.loo)
        value_rows = (
            [
                ValueRow(
                    number,
                    pid,
                    float(values.fedsv[i]),
                    float(values.loo[i]),
                    float(fedsv_norm[i]),
                    float(loo_norm[i]),
                )
                for i, pid in enumerate(values.participants)
            ]
            if values.method != "none"
            else []
        )
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
            valuation_seconds=clock.phases["valuation"],
            round_seconds=finished - clock.started,
            train_wait_seconds=clock.phases["train_wait"],
            aggregation_seconds=clock.phases["aggregation"],
            evaluation_seconds=clock.phases["evaluation"],
            bytes_up=sum(b for b, _ in up),
            bytes_down=sum(b for b, _ in down),
            messages_up=sum(m for _, m in up),
            messages_down=sum(m for _, m in down),
            model_bytes=model_bytes,
            group_rationality_residual=values.group_rationality_residual,
            started_at=clock.started,
            finished_at=finished,
            local_train_seconds=max((r[2] for r in closed.received.values()), default=0.0),
        )
        checkpoint = Checkpoint(
            number, params_to_bytes(new_params), json.dumps(self.rng.bit_generator.state), {}
        )
        self.ledger.commit_round(record, value_rows, traffic_rows, checkpoint)
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
