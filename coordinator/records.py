"""What the ledger records: a round, its per-participant values, its traffic, the checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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
class Checkpoint:
    """The coordinator's state after `round` (the last completed round); only the latest is kept."""

    round: int
    global_params: bytes
    rng_state: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
