"""What the ledger records: a round (with its valuation status), its values, updates and traffic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class RoundStatus(StrEnum):
    """Where a committed round's valuation stands."""

    PENDING = "pending"  # committed; the background valuation has its values still to do
    VALUED = "valued"  # its values are in the ledger
    NOT_VALUED = "not_valued"  # valuation off (utilities only) or nothing was aggregated


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
    max_stderr: float
    status: RoundStatus = RoundStatus.VALUED
    valuation_cpu_seconds: float = math.nan
    valuation_choice: str = ""


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
    status: RoundStatus  # pending, valued or not valued (valuation off, or nothing to value)
    method: str  # the estimator that valued the round ("" while pending, "none" when not valued)
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
    max_stderr: float = math.nan  # the round's largest FedSV standard error (0 exact); NaN while pending
    refused: dict[str, str] = field(default_factory=dict)  # selected, not aggregated: participant -> why
    valuation_cpu_seconds: float = math.nan  # CPU seconds of the valuing process; NaN: not measured
    valuation_choice: str = ""  # why the method (auto's reason) and how a target ended; "": not recorded

    @property
    def pending(self) -> bool:
        """Committed, its values not yet: the background valuation has this round still to do."""
        return self.status is RoundStatus.PENDING

    def absence(self, participant: str) -> str | None:
        """Why a selected participant's update was not aggregated (refused, or late); None if it was."""
        if participant in self.received or participant not in self.selected:
            return None
        return self.refused.get(participant, "late")

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
    fedsv_stderr: float = math.nan  # 0 where exact, inf where unknown; NaN: not recorded (older ledgers)
    player: str = ""  # valued as one player with others (redundant): the first of them; "": alone
    public: bool = False  # its update held nothing beyond the global model's recent steps: valued 0
    alike: str = ""  # its update looked redundant with others' but was valued apart (merging off): the
    # first of them; "": none alike


@dataclass(frozen=True)
class ClassValueRow:
    """A participant's value in one round for the validation samples of one label (they sum to its
    value) and its standard error."""

    round: int
    participant: str
    label: int
    fedsv: float
    stderr: float
    validation: float = math.nan  # the validation set's standard error (NaN: not measured)


@dataclass(frozen=True)
class FoldValueRow:
    """A participant's FedSV and LOO in one round on the validation samples of one fold (they sum to its
    values), and the fold's share of the validation samples."""

    round: int
    participant: str
    fold: int
    share: float
    fedsv: float
    loo: float


@dataclass(frozen=True)
class TrafficRow:
    """Bytes and messages of one RPC in one direction ("up" = participant -> coordinator) in one round."""

    round: int
    rpc: str
    direction: str
    bytes: int
    messages: int


@dataclass(frozen=True)
class EffectRow:
    """An update's effect on the validation loss of its round's aggregate, as the guard's reputation
    measured it (fedsv.fl.reputation): leave-one-out where it was aggregated, add-one where it was not
    (turned away, or quarantined: valued, not aggregated)."""

    round: int
    participant: str
    effect: float  # the change of the mean validation loss (positive: worse)
    stderr: float  # over the validation samples
    aggregated: bool


@dataclass(frozen=True)
class UpdateRow:
    """An update a round aggregated: the sample count its participant declared (its FedAvg weight)."""

    round: int
    participant: str
    num_samples: int
    train_seconds: float  # the participant's own report of its local training time
