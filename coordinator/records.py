"""What the ledger records (a round, its values, its traffic, the checkpoint) and its valuation view."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.rounds import normalized

PENDING = "pending"
"""The valuation method recorded for a round whose values the background worker has yet to commit."""


@dataclass(frozen=True)
class ValuationSummary:
    """What a round's valuation adds to its record once done (see Ledger.commit_values)."""

    utility_before: float
    utility_after: float
    method: str
    evaluations: int
    valuation_seconds: float
    group_rationality_residual: float
    valued_at: float


@dataclass(frozen=True)
class RoundRecord:
    """One completed round as recorded: who took part, utilities, timings and traffic totals."""

    round: int
    selected: list[str]
    received: list[str]
    stragglers: list[str]
    utility_before: float
    utility_after: float
    test_accuracy: float
    test_loss: float
    method: str
    evaluations: int
    valuation_seconds: float
    round_seconds: float
    train_wait_seconds: float
    aggregation_seconds: float
    evaluation_seconds: float
    bytes_up: int
    bytes_down: int
    messages_up: int
    messages_down: int
    model_bytes: int  # size of one copy of the model on the wire (physical-minimum accounting)
    group_rationality_residual: float
    started_at: float
    finished_at: float
    local_train_seconds: float = 0.0  # slowest received participant's own training time (its report)
    valued_at: float = math.nan  # when its values were committed; NaN while valuation is pending

    @property
    def pending(self) -> bool:
        """Committed, its values not yet: the background valuation has this round still to do."""
        return self.method == PENDING

    @property
    def valuation_lag_seconds(self) -> float:
        """Seconds from the round's commit to its values' commit (NaN while pending or not recorded)."""
        return self.valued_at - self.finished_at

    @property
    def physical_minimum_bytes(self) -> int:
        """One model copy down to every selected participant and one delta up from every received one."""
        return self.model_bytes * (len(self.selected) + len(self.received))

    @property
    def bytes_ratio_to_minimum(self) -> float | None:
        """(bytes up + down) / physical minimum; None when the minimum is zero."""
        minimum = self.physical_minimum_bytes
        return (self.bytes_up + self.bytes_down) / minimum if minimum > 0 else None


@dataclass(frozen=True)
class ValueRow:
    """A participant's values in one round (normalized = this round's vector / its L2 norm)."""

    round: int
    participant: str
    fedsv: float
    loo: float
    fedsv_normalized: float
    loo_normalized: float


@dataclass(frozen=True)
class TrafficRow:
    """Bytes and messages of one RPC in one direction ("up" = participant -> coordinator) in one round."""

    round: int
    rpc: str
    direction: str
    bytes: int
    messages: int


@dataclass(frozen=True)
class UpdateRow:
    """An update a round aggregated: the sample count its participant declared (its FedAvg weight)."""

    round: int
    participant: str
    num_samples: int
    train_seconds: float  # the participant's own report of its local training time


@dataclass(frozen=True)
class Checkpoint:
    """The coordinator's state after `round` (the last completed round); only the latest is kept."""

    round: int
    global_params: bytes
    rng_state: str


def value_rows(values: RoundValues) -> list[ValueRow]:
    """A round's values as ledger rows, with each vector's normalized form; none when valuation is off."""
    if values.method == "none":
        return []
    fedsv_norm, loo_norm = normalized(values.fedsv), normalized(values.loo)
    return [
        ValueRow(
            values.round,
            pid,
            float(values.fedsv[i]),
            float(values.loo[i]),
            float(fedsv_norm[i]),
            float(loo_norm[i]),
        )
        for i, pid in enumerate(values.participants)
    ]


def valuation_summary(values: RoundValues, valued_at: float) -> ValuationSummary:
    """The fields a round's record gains from its values."""
    return ValuationSummary(
        utility_before=values.utility_before,
        utility_after=values.utility_after,
        method=values.method,
        evaluations=values.evaluations,
        valuation_seconds=values.seconds,
        group_rationality_residual=values.group_rationality_residual,
        valued_at=valued_at,
    )


def federated_valuation(records: Sequence[RoundRecord], rows: Sequence[ValueRow]) -> FederatedValuation:
    """The per-round values the ledger holds, back as valuation's accounting (rounds valued "none": none).

    A value row of a round the ledger has no record of is refused (ValueError): the two tables are
    written in one transaction, so such a row means the file was altered.
    """
    record_of = {record.round: record for record in records}
    by_round: dict[int, list[ValueRow]] = {}
    for row in rows:
        by_round.setdefault(row.round, []).append(row)
    accounting = FederatedValuation()
    for number, round_rows in sorted(by_round.items()):
        record = record_of.get(number)
        if record is None:
            raise ValueError(f"the ledger holds values of round {number} but no record of that round")
        accounting.add_round(
            RoundValues(
                round=number,
                participants=[r.participant for r in round_rows],
                fedsv=np.array([r.fedsv for r in round_rows], dtype=np.float64),
                loo=np.array([r.loo for r in round_rows], dtype=np.float64),
                utility_before=record.utility_before,
                utility_after=record.utility_after,
                method=record.method,
                evaluations=record.evaluations,
                seconds=record.valuation_seconds,
            )
        )
    return accounting
