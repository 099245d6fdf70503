"""A Flower run's rounds and values into fedsv's ledger (and optional Prometheus metrics)."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from torch import Tensor

from fedsv.ledger import (
    LEDGER_FILE,
    Checkpoint,
    Ledger,
    RoundRecord,
    TrafficRow,
    UpdateRow,
    encode_params,
)
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.round_sink import RoundSink
from fedsv.valuation import FederatedValuation, RoundValues

logger = logging.getLogger(__name__)


def new_run_id() -> str:
    """flower-<local start time>-<random>: sorts by start, unique per app run."""
    return f"flower-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def ledger_file(path: str | Path, run_id: str) -> Path:
    """A `.sqlite` path as is (one run); any other path is a folder of runs, this run's ledger in
    <folder>/<run id>/ledger.sqlite (created), so the same folder serves every run of the app."""
    target = Path(path)
    if target.suffix == ".sqlite":
        target.parent.mkdir(parents=True, exist_ok=True)
        return target
    run_dir = target / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir / LEDGER_FILE


class RunRecorder:
    """A Flower run's ledger and metrics: each round (record, values, updates, traffic, checkpoint) goes
    through the pipeline's RoundSink, as the coordinator's do."""

    def __init__(
        self,
        ledger: str | Path | None,
        config: dict[str, Any],
        run_id: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.accounting = FederatedValuation()
        self.run_id = run_id or new_run_id()
        # resolved now and logged by the strategy: a relative path lands where Flower's process runs
        self.path = ledger_file(ledger, self.run_id).resolve() if ledger is not None else None
        self.ledger = Ledger(self.path) if self.path is not None else None
        if self.ledger is not None:
            self.ledger.ensure_run(self.run_id, config)
        self.metrics = RunMetrics(registry) if registry is not None else None
        self.sink = RoundSink(self.ledger, self.metrics, self.accounting)

    def set_initial_scores(self, scores: dict[int, float]) -> None:
        """The validation scores of other initial models (valuation/round/initial_spread.py), recorded in the
        ledger when it has none yet (a ledger file reused for one run keeps the first)."""
        if self.ledger is not None:
            self.ledger.record_initial_scores(scores)
            self.accounting.initial_scores = self.ledger.initial_scores()
        else:
            self.accounting.initial_scores = list(scores.values())

    def commit(
        self,
        record: RoundRecord,
        values: RoundValues | None,
        num_samples: dict[str, int],
        traffic: list[TrafficRow],
        params: dict[str, Tensor],
    ) -> None:
        """Record a round (values None: valued later, or nothing was aggregated, as the record's status
        says; values given are already in `accounting`)."""
        # Flower replies carry no training time of their own: 0.0 stands for "not reported".
        updates = [UpdateRow(record.round, pid, n, 0.0) for pid, n in num_samples.items()]
        # The coordinator's own checkpoint format, so a Flower ledger reads back like a fedsv one (encoded
        # only where there is a ledger to keep it).
        checkpoint = (
            Checkpoint(record.round, encode_params(params), "{}") if self.ledger is not None else None
        )
        self.sink.commit(record, values, traffic, checkpoint, updates)
        logger.debug("recorded round %d (%s)", record.round, record.status)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
