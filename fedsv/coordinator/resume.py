"""Where a restarted coordinator picks up: the checkpoint, the values so far, the rounds awaiting values."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from fedsv.fl.update_guard import GuardMemory
from fedsv.ledger import Ledger, decode_params, federated_valuation
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.pending import PendingRound, PendingStore
from fedsv.valuation import FederatedValuation

logger = logging.getLogger(__name__)


@dataclass
class RunProgress:
    """What the round loop starts from: w_t, the selection RNG's state (None: fresh from the seed), the
    rounds completed, every value so far, the committed rounds whose values are still to come, and
    what the update guard remembers."""

    params: dict[str, Tensor]
    rng_state: dict[str, Any] | None = None
    completed: int = 0
    accounting: FederatedValuation = field(default_factory=FederatedValuation)
    backlog: list[PendingRound] = field(default_factory=list)
    guard: GuardMemory = field(default_factory=GuardMemory)


def resume(
    ledger: Ledger,
    store: PendingStore,
    metrics: RunMetrics,
    fresh: dict[str, Tensor],
    world: list[str],
    balanced: bool = False,
) -> RunProgress:
    """The progress the ledger holds (a fresh run from `fresh`, w_0, when it holds none), valuing the
    participants of `world` (`balanced`: the run selects by the balanced rule). Inputs of rounds valued
    already, or never committed, are pruned; ValueError when a pending round's inputs are lost."""
    checkpoint = ledger.last_checkpoint()
    initial = ledger.initial_scores()
    if checkpoint is None:
        return RunProgress(fresh, accounting=FederatedValuation(world, initial, balanced))
    records = ledger.rounds()
    accounting = federated_valuation(
        records, ledger.values(), world, ledger.class_values(), ledger.fold_values(), initial, balanced
    )
    metrics.restore(records, accounting.sums(), accounting.sum_errors())
    pending = ledger.pending_rounds()
    store.prune(keep=set(pending))
    progress = RunProgress(
        decode_params(checkpoint.global_params),
        json.loads(checkpoint.rng_state),
        checkpoint.round,
        accounting,
        [store.load(number) for number in pending],
        GuardMemory.from_json(json.loads(checkpoint.extra).get("guard", {})),
    )
    logger.info(
        "resumed after round %d from the ledger's checkpoint; %d rounds await their values",
        progress.completed,
        len(pending),
    )
    return progress
