"""One valuer contract for every engine: a round valued inline, or off the round's path in the background.

The coordinator's round loop and Flower's strategy both hold a Valuer and call it the same way: `value`
once the round is aggregated (its values now, or None when they follow), `committed` once the round is
in the ledger, `finish` at the run's end (the backlog valued), `close` on the way out. Inline, the round
is valued before its commit; in the background its inputs are written durably first (PendingStore), the
round is committed as pending, and the ValuationWorker values it in an idle-priority process and commits
its values to the ledger in round order.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from fedsv.fl.evaluation import EvalSet
from fedsv.fl.updates import ClientUpdate
from fedsv.pipeline.pending import PendingRound, PendingStore
from fedsv.pipeline.valuation_worker import ValuationWorker
from fedsv.valuation import FederatedValuation, RoundValues, ValuationSpec
from fedsv.valuation.round_valuation import GameSettings, value_updates


@dataclass(frozen=True)
class RoundInputs:
    """What a round is valued from: w_t, the updates it aggregated, and its selection where some
    selected were not aggregated (None: the updates' participants)."""

    number: int
    params: Mapping[str, Tensor]
    updates: Sequence[ClientUpdate]
    selected: Sequence[str] | None = None


class Valuer(ABC):
    """Values the rounds of one run into its accounting (and, in the background, its ledger)."""

    background: bool

    def warm_up(self) -> None:
        """Start what valuation needs (the background process) while the participants join."""
        return None

    def wait_for_room(self, stop: threading.Event) -> bool:
        """Before a round: wait while the backlog of rounds awaiting values is full; False if valuation
        failed or `stop` was set."""
        return True

    @abstractmethod
    def value(self, inputs: RoundInputs) -> RoundValues | None:
        """The round's values now, or None when they follow (call `committed` once the round is in)."""

    def committed(self, number: int) -> None:
        """Round `number` is in the ledger (as pending, when its values follow)."""
        return None

    def finish(self, stop: threading.Event) -> bool:
        """Wait until every round has its values; False if valuation failed or `stop` was set."""
        return True

    def settle(self, stop: threading.Event) -> None:
        """After `finish`: let the last values' follow-up work (completion) end."""
        return None

    def close(self) -> None:
        """Stop; rounds not valued yet stay pending in the ledger, their inputs on disk."""
        return None

    @property
    def error(self) -> str:
        """Why valuation failed ("" when it did not)."""
        return ""


class InlineValuer(Valuer):
    """Values each round where it is aggregated, before it is committed."""

    background = False

    def __init__(
        self,
        model: nn.Module,
        validation: EvalSet,
        game: GameSettings,
        spec_of: Callable[[int], ValuationSpec | None],
        accounting: FederatedValuation,
        on_valued: Callable[[RoundValues], None] | None = None,
    ) -> None:
        self.model, self.validation, self.game = model, validation, game
        self.spec_of, self.accounting, self.on_valued = spec_of, accounting, on_valued

    def value(self, inputs: RoundInputs) -> RoundValues:
        values = value_updates(
            self.model,
            inputs.params,
            inputs.updates,
            self.validation,
            inputs.number,
            self.spec_of(inputs.number),
            self.accounting,
            self.game,
            selected=inputs.selected,
        )
        if self.on_valued is not None:
            self.on_valued(values)
        return values


class BackgroundValuer(Valuer):
    """Pipelined valuation: a round's inputs to the PendingStore, its values from the ValuationWorker,
    lagging the rounds, never degrading them."""

    background = True

    def __init__(self, worker: ValuationWorker, store: PendingStore) -> None:
        self.worker, self.store = worker, store

    def warm_up(self) -> None:
        self.worker.warm_up()

    def wait_for_room(self, stop: threading.Event) -> bool:
        return self.worker.wait_for_room(stop)

    def value(self, inputs: RoundInputs) -> None:
        """Write the round's inputs durably (before the ledger says "pending"); its values follow."""
        self.store.save(PendingRound(inputs.number, dict(inputs.params), list(inputs.updates)))
        return None

    def committed(self, number: int) -> None:
        self.worker.submit(number)

    def finish(self, stop: threading.Event) -> bool:
        return self.worker.drain(stop)

    def settle(self, stop: threading.Event) -> None:
        self.worker.settle(stop)

    def close(self) -> None:
        self.worker.close()
        self.store.tidy()

    @property
    def error(self) -> str:
        return self.worker.error
