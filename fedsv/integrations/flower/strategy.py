"""FedSVStrategy: wraps a Flower strategy, values every training round, delegates aggregation unchanged."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log as flower_log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy
from prometheus_client import CollectorRegistry
from torch import Tensor, nn

from fedsv.data.collect import labelled_arrays
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.state import federated_state
from fedsv.integrations.flower.recorder import RunRecorder
from fedsv.integrations.flower.replies import FlowerRound, NameOf, read_round, state_of
from fedsv.integrations.flower.rules import aggregation_rule
from fedsv.integrations.flower.traffic import RoundTraffic, object_bytes
from fedsv.integrations.flower.valuer import (
    ValuerInputs,
    background_blocker,
    background_valuer,
    inline_valuer,
    round_inputs,
)
from fedsv.ledger import RoundStatus, RoundTimes, build_round_record
from fedsv.pipeline.valuers import Valuer
from fedsv.task.interface import Task
from fedsv.valuation import RoundValues, ValuationSpec
from fedsv.valuation.accounting.rounds import valuation_time
from fedsv.valuation.round.initial_spread import measure, reinitialized, seeded
from fedsv.valuation.round.round_inputs import Metric
from fedsv.valuation.round_valuation import GameSettings

logger = logging.getLogger(__name__)

TRAIN, EVALUATE = "train", "evaluate"  # the ledger's traffic rpc names of a Flower round


def round_line(values: RoundValues) -> str:
    """One line per valued round for Flower's log: method, evaluations, top and bottom participant."""
    ranked = sorted(zip(values.participants, values.fedsv, strict=True), key=lambda pv: -pv[1])
    (top, high), (bottom, low) = ranked[0], ranked[-1]
    return (
        f"fedsv: round {values.round} valued ({values.method}, {values.evaluations} evaluations, "
        f"{valuation_time(values.seconds, values.cpu_seconds)}): top {top} {high:+.4f}, "
        f"bottom {bottom} {low:+.4f}"
    )


INITIAL_SEED = 0
"""The seed of a Flower run's other initial models (the app's own w_0 is its own)."""


def _model(task_or_model: Task | nn.Module) -> nn.Module:
    if isinstance(task_or_model, nn.Module):
        return task_or_model
    if isinstance(task_or_model, Task):
        return task_or_model.build_model()
    raise TypeError(f"expected a fedsv Task or a torch nn.Module, got {type(task_or_model).__name__}")


class FedSVStrategy(Strategy):
    """Any FedAvg-like Flower strategy, plus the federated Shapley value of every training round.

    Values come from what the round already moved: the global arrays sent out in configure_train and
    the replies' arrays and example counts (no message is added or changed). `validation` is the
    server's validation set: (x, y) of tensors or arrays, a torch Dataset or a DataLoader (batches of
    pairs, or of {"img": ..., "label": ...} as Flower's examples load them); `valuation` a
    ValuationSpec (default: exact up to 2^m <= its budget); `ledger` a folder that gets one run
    directory per app run (or a .sqlite file for one run) for `fedsv report`; `registry` a Prometheus
    registry that gets the coordinator's fedsv_* metrics; `name_of` a function naming a reply's client
    (default: the reply's participant-id or partition-id, see names.fedsv_names, else node-<id>).

    `background` (default: whenever there is a ledger) values each round off Flower's round path, in
    the coordinator's idle-priority valuation process: aggregate_train returns Flower's aggregate at
    once, values reach the ledger in round order, and start() returns once the backlog is valued. The
    wrapped strategy aggregates, unchanged.
    """

    def __init__(
        self,
        strategy: Strategy | None = None,
        task_or_model: Task | nn.Module | None = None,
        *,
        validation: tuple[Tensor | np.ndarray, Tensor | np.ndarray] | Any,
        valuation: ValuationSpec | None = None,
        ledger: str | Path | None = None,
        metric: Metric = "accuracy",
        device: str = "cpu",
        run_id: str | None = None,
        registry: CollectorRegistry | None = None,
        name_of: NameOf | None = None,
        background: bool | None = None,
        valuation_threads: int = 0,
    ) -> None:
        if task_or_model is None:
            raise TypeError("FedSVStrategy needs the model (an nn.Module) or a fedsv Task")
        self.strategy = strategy if strategy is not None else FedAvg()
        self.aggregation = aggregation_rule(self.strategy)  # refuses what it cannot value, at once
        self.model = _model(task_or_model)
        self.names = list(federated_state(self.model))  # what RoundGame values: parameters, float buffers
        x_val, y_val = labelled_arrays(validation)
        self.spec = valuation if valuation is not None else ValuationSpec()
        self.name_of = name_of
        game = GameSettings(metric, device, "fp32", self.aggregation)
        config = {
            "engine": "flower",
            "strategy": type(self.strategy).__name__,
            "aggregation": dataclasses.asdict(self.aggregation),
            "metric": metric if isinstance(metric, str) else "callable",
            "valuation": repr(self.spec),
        }
        self.recorder = RunRecorder(ledger, config, run_id, registry)
        build = (
            reinitialized(self.model)
            if isinstance(task_or_model, nn.Module)
            else seeded(task_or_model.build_model)
        )
        self.recorder.set_initial_scores(measure(build, x_val, y_val, metric, INITIAL_SEED))
        self.valuer = self._valuer(EvalSet(x_val, y_val), game, background, valuation_threads)
        where = f"ledger {self.recorder.path}" if self.recorder.path is not None else "no ledger"
        how = "in the background" if self.valuer.background else "inline"
        flower_log(
            INFO,
            "fedsv: valuing %s's rounds %s (run %s, %s)",
            config["strategy"],
            how,
            self.recorder.run_id,
            where,
        )
        self._arrays: dict[int, ArrayRecord] = {}
        self._sent: dict[int, list[int]] = {}
        self._traffic: dict[int, RoundTraffic] = {}
        self._started: dict[int, float] = {}
        self._finished = self._closed = False

    def _valuer(
        self, validation: EvalSet, game: GameSettings, background: bool | None, threads: int
    ) -> Valuer:
        told: list[str] = []

        def said(values: RoundValues) -> None:  # shows in `flwr run --stream`
            if values.computed_by and values.computed_by not in told:  # the first round, or a change
                flower_log(INFO, "fedsv: round games computed in %s", values.computed_by)
                told.append(values.computed_by)
            flower_log(INFO, "%s", round_line(values))

        if background is None:
            background = self.recorder.ledger is not None
        if background and self.recorder.ledger is None:
            raise ValueError("FedSVStrategy(background=True) needs a ledger= for the rounds it values later")
        blocker = background_blocker(self.model, validation, game) if background else None
        if blocker is not None:
            flower_log(
                INFO, "fedsv: valuing inline: the valuation process cannot get the model (%s)", blocker
            )
        inputs = ValuerInputs(self.model, validation, self.spec, game, self.recorder, said)
        if background and blocker is None:
            return background_valuer(inputs, threads)
        return inline_valuer(inputs)

    @property
    def rounds(self) -> dict[int, RoundValues]:
        """The values of the rounds valued so far, by round number."""
        return {values.round: values for values in self.recorder.accounting.per_round()}

    # ---------------------------------------------------------------- the run
    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any) -> Result:
        """Flower's run loop (Strategy.start, unchanged), then the backlog of values, if any; then the
        wrapper's end (close()): the app needs no call of its own after start()."""
        try:
            return super().start(grid, initial_arrays, *args, **kwargs)
        finally:
            self.close()

    def finish(self) -> None:
        """Wait until every round's values are in the ledger (background valuation), and say where."""
        if self._finished:
            return
        self._finished = True
        backlog = self.recorder.ledger.pending_rounds() if self.recorder.ledger is not None else []
        if self.valuer.background and backlog:
            flower_log(
                INFO,
                "fedsv: Flower's rounds are done; valuing the backlog of %d round%s (%s) before start() "
                "returns",
                len(backlog),
                "" if len(backlog) == 1 else "s",
                ", ".join(map(str, backlog)),
            )
        if not self.valuer.finish(threading.Event()):
            flower_log(
                ERROR, "fedsv: valuation failed; the rounds left stay pending in %s", self.recorder.path
            )
            return
        valued = len(self.recorder.accounting.per_round())
        where = ""
        if self.recorder.path is not None:  # the table, and the same page as a fedsv run's
            where = f"; `fedsv report {self.recorder.path.parent}` (`--html` for report.html)"
        flower_log(INFO, "fedsv: %d rounds valued (run %s)%s", valued, self.recorder.run_id, where)

    # ---------------------------------------------------------------- training: the valued part
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's messages, as they are; keeps the round's global arrays (a reference)."""
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._arrays[server_round] = arrays
        self._sent[server_round] = [int(m.metadata.dst_node_id) for m in messages]
        self._started[server_round] = time.time()
        self._traffic[server_round] = traffic = RoundTraffic()
        traffic.add(TRAIN, "down", messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Value the round's replies (or hand them to the background), then let the wrapped strategy
        aggregate them, unchanged."""
        replies = list(replies)
        self._traffic[server_round].add(TRAIN, "up", replies)  # before: robust rules pop the arrays
        started = time.perf_counter()
        arrays = self._arrays.pop(server_round)
        try:
            flower_round = read_round(
                server_round,
                arrays,
                replies,
                self.names,
                getattr(self.strategy, "weighted_by_key", "num-examples"),
                self.name_of,
            )
        except ValueError as exc:  # a reply fedsv cannot value: the round is recorded, not valued
            flower_log(WARNING, "fedsv: round %d not valued: %s", server_round, exc)
            flower_round = FlowerRound(server_round, [], [], [], [], state_of(arrays, self.names), [])
        else:
            if not flower_round.participants:
                logger.warning("round %d: no reply to aggregate, nothing to value", server_round)
        values = self.valuer.value(round_inputs(flower_round)) if flower_round.participants else None
        valued = time.perf_counter()
        result = self.strategy.aggregate_train(server_round, replies)
        aggregated = time.perf_counter()
        self._record(flower_round, values, result[0], (aggregated - valued, valued - started))
        if values is None and flower_round.participants:
            self.valuer.committed(server_round)
        return result

    def _record(
        self,
        flower_round: FlowerRound,
        values: RoundValues | None,
        arrays: ArrayRecord | None,
        seconds: tuple[float, float],
    ) -> None:
        number = flower_round.round
        traffic = self._traffic.pop(number)
        by_node = dict(zip(flower_round.node_ids, flower_round.participants, strict=True))
        selected = [by_node.get(node, f"node-{node}") for node in self._sent.pop(number)]
        started = self._started.pop(number)
        global_params = flower_round.global_params
        params = state_of(arrays, self.names) if arrays is not None else global_params
        rows = traffic.ledger_rows(number)
        aggregation, valuation = seconds
        finished = time.time()
        times = RoundTimes(
            started_at=started,
            finished_at=finished,
            train_wait=max(0.0, finished - started - aggregation - valuation),
            aggregation=aggregation,
            valuation=valuation,
            evaluation=0.0,
        )
        record = build_round_record(
            number,
            selected,
            flower_round.participants,
            values,
            rows,
            object_bytes(arrays) if arrays is not None else 0,
            times,
            status=None if flower_round.participants else RoundStatus.NOT_VALUED,
        )
        counts = dict(zip(flower_round.participants, flower_round.num_samples, strict=True))
        self.recorder.commit(record, values, counts, rows, params)

    # ---------------------------------------------------------------- evaluation: delegated as is
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()
        logger.info("FedSV: %s rule, %s, ledger %s", self.aggregation, self.spec, self.recorder.ledger)

    def totals(self) -> dict[str, dict[str, float]]:
        """Cumulative FedSV, LOO and their normalized forms per client over the rounds valued so far."""
        return self.recorder.accounting.totals()

    def close(self) -> None:
        """Wait for the backlog of values (finish()), stop the valuation process and close the ledger.
        start() ends with it; call it only after rounds driven without start(). A second call does
        nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.finish()
        finally:
            self.valuer.close()
            self.recorder.close()

    def __getattr__(self, name: str) -> Any:
        """The wrapped strategy's own settings (fraction_train, weighted_by_key, ...) read through."""
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)
