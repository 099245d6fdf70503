"""A finished round into the ledger: its record, values (when inline), updates, traffic and checkpoint."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum

from torch import Tensor

from fedsv.coordinator.round_board import OpenRound
from fedsv.coordinator.traffic import TrafficCounter
from fedsv.ledger import (
    Checkpoint,
    EffectRow,
    RoundRecord,
    RoundTimes,
    TestScore,
    TrafficRow,
    UpdateRow,
    build_round_record,
    encode_params,
)
from fedsv.pipeline.round_sink import RoundSink
from fedsv.valuation import RoundValues

logger = logging.getLogger(__name__)


class Phase(StrEnum):
    """A round's consecutive phases on the coordinator."""

    BACKLOG = "backlog"  # waiting for room in the valuation backlog
    TRAIN_WAIT = "train_wait"  # the selected train; their updates arrive
    AGGREGATION_AND_VALUATION = "aggregation_and_valuation"
    EVALUATION = "evaluation"  # w_{t+1} on the test set


class PhaseClock:
    """Wall-clock seconds of a round's consecutive phases."""

    def __init__(self) -> None:
        self.started = self._last = time.time()
        self.phases: dict[Phase, float] = {}

    def lap(self, phase: Phase) -> None:
        now = time.time()
        self.phases[phase] = now - self._last
        self._last = now


@dataclass(frozen=True)
class RoundResult:
    """What a round produced: the closed round, w_{t+1}, its values when valued inline (None: they
    follow from the background valuer), the test score, one model copy's bytes, and its timings."""

    closed: OpenRound
    params: dict[str, Tensor]
    values: RoundValues | None
    test: TestScore
    model_bytes: int
    aggregation_seconds: float
    valuation_seconds: float
    clock: PhaseClock


class RoundCommitter:
    """Builds a finished round's record and rows and commits them through the pipeline's RoundSink (a
    pending round's inputs are on disk before it: the background valuer wrote them)."""

    def __init__(self, sink: RoundSink, traffic: TrafficCounter) -> None:
        self.sink, self.traffic = sink, traffic

    def commit(self, result: RoundResult, rng_state: str, extra: str = "{}") -> RoundRecord:
        """Write the round, its values (unless pending), traffic, updates and checkpoint (w_{t+1} and
        the selection RNG's state after the round) in one transaction; export it to the metrics."""
        closed, values = result.closed, result.values
        number = closed.round
        taken = self.traffic.take(number)
        traffic_rows = [TrafficRow(number, rpc, d, b, m) for (rpc, d), (b, m) in sorted(taken.items())]
        times = RoundTimes(
            started_at=result.clock.started,
            finished_at=time.time(),
            train_wait=result.clock.phases[Phase.TRAIN_WAIT],
            aggregation=result.aggregation_seconds,
            valuation=result.valuation_seconds,
            evaluation=result.clock.phases[Phase.EVALUATION],
            local_train=max((u.train_seconds for u in closed.received.values()), default=0.0),
        )
        record = build_round_record(
            number,
            closed.selected,
            list(closed.received),
            values,
            traffic_rows,
            result.model_bytes,
            times,
            result.test,
            refused=closed.refused,
        )
        updates = [
            UpdateRow(number, u.participant, u.num_samples, u.train_seconds)
            for u in sorted(closed.received.values(), key=lambda u: u.participant)
        ]
        effects = [
            EffectRow(number, pid, e.effect, e.stderr, pid in closed.received)
            for pid, e in sorted(closed.effects.items())
        ]
        checkpoint = Checkpoint(number, encode_params(result.params), rng_state, extra)
        self.sink.commit(record, values, traffic_rows, checkpoint, updates, effects)
        logger.info(
            "round %d done: received %d/%d, accuracy %.4f, valuation %s %.2fs",
            number,
            len(record.received),
            len(record.selected),
            record.test_accuracy,
            record.status if values is None else record.method,
            record.valuation_seconds,
        )
        return record
