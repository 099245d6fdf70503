"""The coordinator's round recipe: select, dispatch, collect, bound, aggregate (and value inline), commit."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time

import numpy as np

from fedsv.coordinator.guard_report import refusals, report_guard
from fedsv.coordinator.resume import RunProgress
from fedsv.coordinator.round_board import OpenRound
from fedsv.coordinator.round_commit import Phase, PhaseClock, RoundCommitter, RoundResult
from fedsv.coordinator.run_end import FINISHED, STOPPED, EndKind, RunEnd
from fedsv.coordinator.run_inputs import RunInputs
from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.server_config import ServerConfig
from fedsv.fl.aggregation import aggregate
from fedsv.fl.evaluation import evaluate
from fedsv.fl.input_span import input_span
from fedsv.fl.ranks import participant_id
from fedsv.fl.referee import ValidationReferee
from fedsv.fl.selection import train_seed
from fedsv.fl.update_guard import guard_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.ledger import TestScore
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.valuers import RoundInputs, Valuer
from fedsv.settings.run import RunConfig
from fedsv.task.validation_step import validation_step
from fedsv.valuation.round_valuation import GameSettings
from fedsv.wire.codec import wire_size

logger = logging.getLogger(__name__)


class RoundLoop:
    """Runs the rounds of one run from `progress` (a fresh run, or where the ledger left off).

    Its `valuer` (fedsv.pipeline.valuers) values each round: inline before the round is committed, or in
    the background, the round committed as pending and its values following.
    """

    def __init__(
        self,
        run: RunConfig,
        server: ServerConfig,
        state: RunState,
        inputs: RunInputs,
        game_settings: GameSettings,
        progress: RunProgress,
        committer: RoundCommitter,
        metrics: RunMetrics,
        valuer: Valuer,
    ) -> None:
        self.run_config, self.server_config, self.state = run, server, state
        self.inputs, self.committer, self.metrics, self.valuer = inputs, committer, metrics, valuer
        self.stop_event = threading.Event()
        self.game_settings = game_settings
        self.params, self.completed, self.accounting = (
            progress.params,
            progress.completed,
            progress.accounting,
        )
        self.selector = run.selector()
        if progress.rng_state is not None:
            self.selector.rng.bit_generator.state = progress.rng_state
        self.guard = progress.guard
        self.span = input_span(inputs.model, inputs.validation)  # the made-up-input screen's, once a run
        self.scratch = copy.deepcopy(inputs.model)  # the trusted step trains here, never on the run's model
        for pid in self.guard.reputation.quarantined:  # resumed in quarantine
            metrics.participant_quarantined.labels(participant=pid).set(1)

    def run(self) -> RunEnd:
        """Run the remaining rounds. With pipelined valuation the run is finished once every round also
        has its values: the participants are released after the last round, then the backlog is valued."""
        self.valuer.warm_up()  # the valuation process loads while the participants join
        try:
            end = self._rounds()
            self.state.board.finish(end, self.completed)
            if end.finished:
                if not self.valuer.finish(self.stop_event):
                    return self._stopped(EndKind.VALUATION_FAILED, self.valuer.error)
                self.valuer.settle(self.stop_event)  # every value is in: a stop here ends it finished
            return end
        finally:
            self.valuer.close()

    def _stopped(self, kind: EndKind, detail: str = "") -> RunEnd:
        """STOPPED when asked to stop (a signal), else the end of this kind."""
        return STOPPED if self.stop_event.is_set() else RunEnd(kind, detail)

    def _rounds(self) -> RunEnd:
        run = self.run_config
        if self.completed >= run.rounds:
            return FINISHED
        # Until every participant holds a task stream (or, under a lower --max-participants, as many as may).
        sessions = self.state.sessions
        deadline = time.time() + self.server_config.join_timeout
        if not sessions.wait_for_participants(
            min(run.participants, sessions.max_participants), deadline, self.stop_event
        ):
            return self._stopped(EndKind.NO_PARTICIPANTS)
        for number in range(self.completed + 1, run.rounds + 1):
            end = self._round(number)
            if end is not None:
                return end
        return FINISHED

    def _open(self, number: int) -> OpenRound:
        """Select (the run's rule, or the round's entry of a fixed `selection`), and open the round.

        Only the selected cost work here: a connected participant that is not selected is not looked at
        (its task stream stays parked until it is selected or the run ends)."""
        run = self.run_config
        ranks = self.selector.ranks(number)
        selected = [participant_id(r) for r in ranks]
        seeds = {participant_id(r): train_seed(run.seed, number, r) for r in ranks}
        opened = OpenRound(
            number, selected, time.time() + self.server_config.round_timeout, self.params, seeds
        )
        self.metrics.current_round.set(number)
        self.metrics.participants_selected.set(len(selected))
        self.state.board.open_round(opened)
        logger.info("round %d: selected %s", number, selected)
        return opened

    def _collect(self, opened: OpenRound) -> bool:
        """Wait until all selected reported or the deadline passed; then until a quorum, if short of one."""
        need = max(1, int(np.ceil(self.server_config.quorum * len(opened.selected))))
        hard_deadline = opened.deadline + self.server_config.quorum_wait
        return self.state.board.wait_for_updates(opened, need, hard_deadline, self.stop_event)

    def _round(self, number: int) -> RunEnd | None:
        """One round, committed; None, or how the run ends when this round cannot complete."""
        clock = PhaseClock()  # a round's time includes any wait for the valuation backlog to shrink
        if not self.valuer.wait_for_room(self.stop_event):
            return self._stopped(EndKind.VALUATION_FAILED, self.valuer.error)
        clock.lap(Phase.BACKLOG)
        opened = self._open(number)
        quorum = self._collect(opened)
        closed = self.state.board.close_round()
        if not quorum:
            return self._stopped(EndKind.NO_QUORUM, f"no quorum in round {number}")
        clock.lap(Phase.TRAIN_WAIT)
        updates = self._bounded(closed)
        if not updates:
            return RunEnd(EndKind.ALL_OVER_BOUND, f"every update of round {number} was over the norm bound")
        result = self._step(closed, updates, clock, wire_size(opened.params))
        extra = json.dumps({"guard": self.guard.to_json()})
        self.committer.commit(result, json.dumps(self.selector.rng.bit_generator.state), extra)
        self.valuer.committed(number)
        self.params, self.completed = result.params, number
        return None

    def _step(
        self, closed: OpenRound, updates: list[ClientUpdate], clock: PhaseClock, model_bytes: int
    ) -> RoundResult:
        """Aggregate the round's updates, value them (inline: now; in the background: their inputs to
        disk, the values to follow), then score w_{t+1} on the test set."""
        number, inputs = closed.round, self.inputs
        started = time.perf_counter()
        new_params = aggregate(self.params, updates, number, self.game_settings.aggregation)
        aggregated = time.perf_counter()
        values = self.valuer.value(RoundInputs(number, self.params, updates, closed.selected))
        valuation = time.perf_counter() - aggregated if values is not None else 0.0
        clock.lap(Phase.AGGREGATION_AND_VALUATION)  # split by the timings above
        test = TestScore()  # no test set: nothing to report
        if inputs.test is not None:
            test = TestScore(*evaluate(inputs.model, new_params, inputs.test.x, inputs.test.y))
        clock.lap(Phase.EVALUATION)
        return RoundResult(
            closed, new_params, values, test, model_bytes, aggregated - started, valuation, clock
        )

    def _bounded(self, closed: OpenRound) -> list[ClientUpdate]:
        """The round's updates after the guard (update_guard: weights capped, the norm bound, the
        direction check); an update turned away no longer counts as received."""
        run = self.run_config
        referee = ValidationReferee(self.inputs.model, self.params, self.inputs.validation)
        guarded = guard_updates(
            sorted(closed.received.values(), key=lambda u: u.participant),  # not the order they arrived in
            run.norm_bound(),
            run.guard(),
            self.guard,
            self.state.sessions.declared_counts(),
            referee,
            self.params,
            self.span,
            validation_step(
                self.inputs.task,
                self.scratch,
                self.params,
                self.inputs.validation,
                run.local_training(),
                closed.round,
            ),
        )
        for pid, reason in refusals(guarded).items():
            del closed.received[pid]
            closed.refused[pid] = reason
        report_guard(closed.round, guarded, self.metrics)
        closed.effects = guarded.evidence
        return guarded.updates


__all__ = ["RoundLoop"]
