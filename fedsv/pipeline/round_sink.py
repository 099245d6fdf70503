"""Where every engine's rounds go: one SQLite transaction into the ledger, then the metrics."""

from __future__ import annotations

from collections.abc import Sequence

from fedsv.ledger import (
    Checkpoint,
    EffectRow,
    Ledger,
    RoundRecord,
    TrafficRow,
    UpdateRow,
    class_rows,
    value_rows,
)
from fedsv.pipeline.metrics import RunMetrics
from fedsv.valuation import FederatedValuation, RoundValues


class RoundSink:
    """Commits a round (its record, values when valued now, traffic, updates, the guard's effects and
    the checkpoint) in one transaction, and reports it to the metrics. Either may be absent (a Flower
    run without a ledger, a run without a metrics port)."""

    def __init__(
        self, ledger: Ledger | None, metrics: RunMetrics | None, accounting: FederatedValuation
    ) -> None:
        self.ledger, self.metrics, self.accounting = ledger, metrics, accounting

    def commit(
        self,
        record: RoundRecord,
        values: RoundValues | None,
        traffic: Sequence[TrafficRow],
        checkpoint: Checkpoint | None,
        updates: Sequence[UpdateRow],
        effects: Sequence[EffectRow] = (),
    ) -> None:
        """Values None: they follow (or nothing was aggregated), as the record's status says; values
        given are already in `accounting`. `checkpoint` None: there is no ledger to keep it."""
        if self.ledger is not None:
            if checkpoint is None:
                raise ValueError(f"round {record.round}: a ledger needs the round's checkpoint")
            rows, classes = ([], []) if values is None else (value_rows(values), class_rows(values))
            self.ledger.commit_round(record, rows, traffic, checkpoint, updates, classes, effects)
        if self.metrics is None:
            return
        if values is None or values.method == "none":  # nothing valued: no value gauge is set to 0
            self.metrics.observe_training(record)
        else:
            sums, errors = self.accounting.sums(), self.accounting.sum_errors()
            self.metrics.observe_round(record, sums, errors, values.alike)
