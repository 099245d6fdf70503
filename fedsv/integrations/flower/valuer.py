"""How the Flower wrapper values a round: inline in aggregate_train, or off the round's path.

In the background (the default with a ledger) a round's inputs are written durably beside the ledger,
the round is committed as pending, and the coordinator's own ValuationWorker values it in a spawned,
idle-priority process; values reach the ledger in round order, and the run's end waits for the
backlog. Inline (no ledger, or background=False) the round is valued before Flower's aggregate.
"""

from __future__ import annotations

import pickle
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from fedsv.fl.evaluation import EvalSet
from fedsv.fl.updates import ClientUpdate
from fedsv.integrations.flower.recorder import RunRecorder
from fedsv.integrations.flower.replies import FlowerRound
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.pending import PendingRound, PendingStore
from fedsv.pipeline.valuation_process import GivenSetup
from fedsv.pipeline.valuation_worker import ValuationWorker
from fedsv.valuation import RoundValues, ValuationSpec
from fedsv.valuation.round_valuation import GameSettings, value_updates


def _updates(flower_round: FlowerRound) -> list[ClientUpdate]:
    return [
        ClientUpdate(pid, delta, n)
        for pid, delta, n in zip(
            flower_round.participants, flower_round.deltas, flower_round.num_samples, strict=True
        )
    ]


@dataclass(frozen=True)
class ValuerInputs:
    """What a valuer values a round with, and where its values go (the recorder's accounting, then
    `on_valued`)."""

    model: nn.Module
    validation: EvalSet
    spec: ValuationSpec
    game: GameSettings
    recorder: RunRecorder
    on_valued: Callable[[RoundValues], None]


class Valuer(ABC):
    """Values the rounds of one Flower run into the recorder's accounting."""

    background: bool

    def __init__(self, inputs: ValuerInputs) -> None:
        self.inputs = inputs

    @abstractmethod
    def value(self, flower_round: FlowerRound) -> RoundValues | None:
        """The round's values now, or None when they follow (call committed() once the round is in)."""

    @abstractmethod
    def committed(self, number: int) -> None:
        """Round `number` is in the ledger."""

    @abstractmethod
    def finish(self) -> bool:
        """Wait until every round has its values; False if valuation failed."""

    @abstractmethod
    def close(self) -> None:
        """Stop (rounds not valued yet stay pending in the ledger, their inputs on disk)."""


class InlineValuer(Valuer):
    """Values each round in aggregate_train, before Flower aggregates it."""

    background = False

    def value(self, flower_round: FlowerRound) -> RoundValues:
        given = self.inputs
        values = value_updates(
            given.model,
            flower_round.global_params,
            _updates(flower_round),
            given.validation,
            flower_round.round,
            given.spec,
            given.recorder.accounting,
            given.game,
        )
        given.on_valued(values)
        return values

    def committed(self, number: int) -> None:
        """Nothing follows: the round was valued before its commit."""

    def finish(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing runs in the background."""


class BackgroundValuer(Valuer):
    """The coordinator's pipelined valuation: PendingStore + ValuationWorker, lagging, never degrading."""

    background = True

    def __init__(self, inputs: ValuerInputs, threads: int = 0) -> None:
        super().__init__(inputs)
        recorder, spec = inputs.recorder, inputs.spec
        assert recorder.ledger is not None and recorder.path is not None
        # beside the ledger file: <run dir>/ledger.pending/, or <name>.pending/ for a <name>.sqlite
        self.store = PendingStore(recorder.path.with_suffix(".pending"))
        metrics = recorder.metrics if recorder.metrics is not None else RunMetrics()
        self.worker = ValuationWorker(
            GivenSetup(inputs.model, inputs.validation),
            inputs.game,
            lambda _: spec,
            recorder.accounting,
            recorder.ledger,
            metrics,
            self.store,
            threads=threads,
            on_valued=inputs.on_valued,
        )
        self.worker.warm_up()

    def value(self, flower_round: FlowerRound) -> None:
        """Write the round's inputs durably (before the ledger says "pending")."""
        self.store.save(PendingRound(flower_round.round, flower_round.global_params, _updates(flower_round)))
        return None

    def committed(self, number: int) -> None:
        self.worker.submit(number)

    def finish(self) -> bool:
        return self.worker.drain(threading.Event())

    def close(self) -> None:
        self.worker.close()

    @property
    def error(self) -> str:
        return self.worker.error


def background_blocker(model: nn.Module, validation: EvalSet, game: GameSettings) -> str | None:
    """Why the valuation process could not be handed the model, data and settings, or None when it can:
    they must pickle, and by reference to modules the process can import (not the parent's __main__,
    which it does not run)."""
    in_main = [type(layer).__name__ for layer in model.modules() if type(layer).__module__ == "__main__"]
    if getattr(game.metric, "__module__", None) == "__main__":
        in_main.append(getattr(game.metric, "__name__", "the metric"))
    if in_main:
        return f"{in_main[0]} is defined in __main__; define it in a module to value in the background"
    try:
        pickle.dumps((GivenSetup(model, validation), game))
    except Exception as exc:  # anything pickle raises: a lambda metric, a local class, an open handle
        return f"{type(exc).__name__}: {exc}"
    return None
