"""How the Flower wrapper values a round: the pipeline's valuers (fedsv.pipeline.valuers), built for Flower.

In the background (the default with a ledger) a round's inputs are written durably beside the ledger,
the round is committed as pending, and the same ValuationWorker as the coordinator's values it in a
spawned, idle-priority process; values reach the ledger in round order, and the run's end waits for
the backlog. Inline (no ledger, or background=False) the round is valued before Flower's aggregate.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from fedsv.fl.evaluation import EvalSet
from fedsv.fl.updates import ClientUpdate
from fedsv.integrations.flower.recorder import RunRecorder
from fedsv.integrations.flower.replies import FlowerRound
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.pending import PendingStore
from fedsv.pipeline.valuation_process import GivenSetup
from fedsv.pipeline.valuation_worker import ValuationWorker
from fedsv.pipeline.valuers import BackgroundValuer, InlineValuer, RoundInputs
from fedsv.valuation import RoundValues, ValuationSpec
from fedsv.valuation.round_valuation import GameSettings


def round_inputs(flower_round: FlowerRound) -> RoundInputs:
    """What the pipeline values a Flower round from: w_t and the replies' deltas and counts."""
    updates = [
        ClientUpdate(pid, delta, n)
        for pid, delta, n in zip(
            flower_round.participants, flower_round.deltas, flower_round.num_samples, strict=True
        )
    ]
    return RoundInputs(flower_round.round, flower_round.global_params, updates)


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


def inline_valuer(inputs: ValuerInputs) -> InlineValuer:
    """Values each round in aggregate_train, before Flower aggregates it."""
    spec = inputs.spec
    return InlineValuer(
        inputs.model,
        inputs.validation,
        inputs.game,
        lambda _: spec,
        inputs.recorder.accounting,
        inputs.on_valued,
    )


def background_valuer(inputs: ValuerInputs, threads: int = 0) -> BackgroundValuer:
    """The coordinator's pipelined valuation, beside the recorder's ledger: <run dir>/ledger.pending/ (or
    <name>.pending/ for a <name>.sqlite) holds the rounds' inputs until their values are in."""
    recorder, spec = inputs.recorder, inputs.spec
    assert recorder.ledger is not None and recorder.path is not None
    store = PendingStore(recorder.path.with_suffix(".pending"))
    worker = ValuationWorker(
        GivenSetup(inputs.model, inputs.validation),
        inputs.game,
        lambda _: spec,
        recorder.accounting,
        recorder.ledger,
        recorder.metrics if recorder.metrics is not None else RunMetrics(),
        store,
        threads=threads,
        on_valued=inputs.on_valued,
    )
    valuer = BackgroundValuer(worker, store)
    valuer.warm_up()
    return valuer


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
