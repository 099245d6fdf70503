"""The one place a RoundRecord is built: from who took part, the round's values, traffic and timings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fedsv.ledger.records import RoundRecord, RoundStatus, TrafficRow
from fedsv.ledger.valuation_view import status_of
from fedsv.valuation import RoundValues


@dataclass(frozen=True)
class RoundTimes:
    """Wall-clock facts of a round: when it started and was committed, and its phases in seconds.

    local_train: the slowest received participant's own report of its training time (0: not reported).
    """

    started_at: float
    finished_at: float
    train_wait: float
    aggregation: float
    valuation: float
    evaluation: float
    local_train: float = 0.0


@dataclass(frozen=True)
class TestScore:
    """The new global model's accuracy and loss on the test set (NaN: no test set)."""

    accuracy: float = math.nan
    loss: float = math.nan


def traffic_totals(rows: Sequence[TrafficRow]) -> tuple[int, int, int, int]:
    """(bytes up, bytes down, messages up, messages down) summed over a round's traffic rows."""
    up = [r for r in rows if r.direction == "up"]
    down = [r for r in rows if r.direction == "down"]
    return (
        sum(r.bytes for r in up),
        sum(r.bytes for r in down),
        sum(r.messages for r in up),
        sum(r.messages for r in down),
    )


def build_round_record(
    number: int,
    selected: Sequence[str],
    received: Sequence[str],
    values: RoundValues | None,
    traffic: Sequence[TrafficRow],
    model_bytes: int,
    times: RoundTimes,
    test: TestScore = TestScore(),
    status: RoundStatus | None = None,
    refused: Mapping[str, str] | None = None,
) -> RoundRecord:
    """The record of round `number`.

    refused: selected participants whose update was refused (participant -> reason); the others
    selected but not received are stragglers.
    values: the round's values when they are known now (inline valuation, or utilities only with
    valuation off); None for a round whose values come later (status PENDING, the default then) or
    that aggregated nothing (pass status NOT_VALUED).
    """
    if status is None:
        status = RoundStatus.PENDING if values is None else status_of(values)
    bytes_up, bytes_down, messages_up, messages_down = traffic_totals(traffic)
    if values is None:
        method = "" if status is RoundStatus.PENDING else "none"
        before = after = residual = valued_at = max_stderr = math.nan
        evaluations = 0
    else:
        method, evaluations = values.method, values.evaluations
        before, after, residual = (
            values.utility_before,
            values.utility_after,
            values.group_rationality_residual,
        )
        valued_at, max_stderr = times.finished_at, values.max_stderr
    return RoundRecord(
        round=number,
        selected=list(selected),
        received=sorted(received),
        stragglers=[p for p in selected if p not in set(received) and p not in (refused or {})],
        refused={p: str(r) for p, r in sorted((refused or {}).items()) if p not in set(received)},
        utility_before=before,
        utility_after=after,
        test_accuracy=test.accuracy,
        test_loss=test.loss,
        status=status,
        method=method,
        evaluations=evaluations,
        valuation_seconds=times.valuation,
        round_seconds=times.finished_at - times.started_at,
        train_wait_seconds=times.train_wait,
        aggregation_seconds=times.aggregation,
        evaluation_seconds=times.evaluation,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        messages_up=messages_up,
        messages_down=messages_down,
        model_bytes=model_bytes,
        group_rationality_residual=residual,
        started_at=times.started_at,
        finished_at=times.finished_at,
        local_train_seconds=times.local_train,
        valued_at=valued_at,
        max_stderr=max_stderr,
        valuation_cpu_seconds=math.nan if values is None else values.cpu_seconds,
        valuation_choice="" if values is None else values.choice,
    )
