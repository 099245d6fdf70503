"""The coordinator's round recipe: select, dispatch, collect, bound, aggregate (and value inline), commit."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time

import numpy as np

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
from fedsv.fl.update_guard import GuardedRound, guard_updates
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
        bounded = guarded.bounded
        reasons = {
            **dict.fromkeys(bounded.rejected, "norm_rejected"),
            **dict.fromkeys(guarded.against, "against_validation"),
            **dict.fromkeys(guarded.turned_away, "direction_rejected"),
            **dict.fromkeys(guarded.null, "null_update"),
            **dict.fromkeys(guarded.mimic, "public_step"),
            **dict.fromkeys(guarded.made_up, "made_up"),
            **dict.fromkeys(guarded.worse, "round_worse"),
            **dict.fromkeys(guarded.held, "quarantined"),
        }
        for pid, reason in reasons.items():
            del closed.received[pid]
            closed.refused[pid] = reason
        for pid, declared in guarded.capped.items():
            self.metrics.reject("weight_capped")
            logger.warning(
                "round %d: %s declared %d samples; its FedAvg weight is capped", closed.round, pid, declared
            )
        for pid in [*bounded.clipped, *bounded.rejected]:
            reason = "norm_clipped" if pid in bounded.clipped else "norm_rejected"
            self.metrics.reject(reason)
            logger.warning(
                "round %d: %s's update has norm %.4g, over the bound %.4g: %s",
                closed.round,
                pid,
                bounded.norms[pid],
                bounded.bound,
                "clipped" if reason == "norm_clipped" else "rejected",
            )
        said = {
            "against_validation": "points against the step the validation set itself takes from w_t",
            "direction_rejected": "works against the validation set and the round is better without it",
            "null_update": "carries no information (norm 0, or a random direction): a free rider's",
            "round_worse": "points against the validation set in a round whose aggregate it made worse",
        }
        for reason, found in (
            ("against_validation", guarded.against),
            ("direction_rejected", guarded.turned_away),
            ("null_update", guarded.null),
            ("round_worse", guarded.worse),
        ):
            for pid, cosine in found.items():
                self.metrics.reject(reason)
                logger.warning(
                    "round %d: %s's update %s (its cosine with the validation set's %s: %.3f): rejected",
                    closed.round,
                    pid,
                    said[reason],
                    "step" if reason == "against_validation" else "descent",
                    cosine,
                )
        screened = {  # reason -> (found: participant -> a share of its update, what that share says)
            "public_step": (guarded.mimic, "carries nothing beyond the global model's recent steps (%.0f%% "
                            "of it along them): a free rider's"),
            "made_up": (guarded.made_up, "moved its first layer outside the span of the validation data's "
                        "inputs (%.0f%% of it there) as made-up inputs do"),
        }  # fmt: skip
        for reason, (found_share, message) in screened.items():
            for pid, share in found_share.items():
                self.metrics.reject(reason)
                logger.warning(f"round %d: %s's update {message}: rejected", closed.round, pid, 100 * share)
        for pid, along in guarded.public.items():
            self.metrics.updates_public.inc()
            logger.warning(
                "round %d: %s's update carries nothing beyond the global model's recent steps (%.0f%% of "
                "it along them): aggregated (the guard's screens are off), valued 0 in every coalition",
                closed.round,
                pid,
                100 * along,
            )
        closed.effects = guarded.evidence
        self._report_reputation(closed.round, guarded)
        return guarded.updates

    def _report_reputation(self, number: int, guarded: GuardedRound) -> None:
        """Quarantine in the logs and the metrics: who is held back, who entered or left quarantine."""
        for pid, effect in guarded.held.items():
            self.metrics.reject("quarantined")
            logger.warning(
                "round %d: %s is quarantined: its update (validation loss %+.4g if aggregated) is valued, "
                "not aggregated",
                number,
                pid,
                effect,
            )
        for pid, score in guarded.reputation.quarantined.items():
            self.metrics.participant_quarantined.labels(participant=pid).set(1)
            logger.warning(
                "round %d: %s quarantined from the next round: its last updates made the validation loss "
                "worse by %.1f standard errors",
                number,
                pid,
                score,
            )
        for pid, score in guarded.reputation.readmitted.items():
            self.metrics.participant_quarantined.labels(participant=pid).set(0)
            logger.info("round %d: %s readmitted (its updates in quarantine score %.1f)", number, pid, score)


__all__ = ["RoundLoop"]
