"""Background valuation: values committed rounds in round order while the next rounds train."""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections.abc import Callable

from torch import nn

from fedsv.coordinator.metrics import CoordinatorMetrics
from fedsv.coordinator.pending import PendingRound, PendingStore
from fedsv.fl.evaluation import EvalSet
from fedsv.ledger import Ledger, valuation_summary, value_rows
from fedsv.valuation import FederatedValuation, ValuationSpec
from fedsv.valuation.round_valuation import GameSettings, value_updates

logger = logging.getLogger(__name__)


class ValuationWorker:
    """One thread that values the rounds handed to it, commits their values and drops their inputs.

    Rounds are valued in the order they are submitted (round order). The round loop holds back while
    `capacity` rounds wait (wait_for_room), and waits for the backlog at the end of the run (drain).
    A valuation that fails stops the worker: later rounds stay pending, in the ledger and on disk, and
    a restarted coordinator values them again.
    """

    def __init__(
        self,
        model: nn.Module,
        validation: EvalSet,
        game_settings: GameSettings,
        spec_of: Callable[[int], ValuationSpec | None],
        accounting: FederatedValuation,
        ledger: Ledger,
        metrics: CoordinatorMetrics,
        store: PendingStore,
        capacity: int,
    ) -> None:
        # Its own copy of the model: the round loop evaluates the global model at the same time.
        self._model = copy.deepcopy(model)
        self._validation, self._game_settings, self._spec_of = validation, game_settings, spec_of
        self._accounting, self._ledger, self._metrics, self._store = accounting, ledger, metrics, store
        self.capacity = capacity
        self._jobs: queue.Queue[PendingRound | None] = queue.Queue()
        self._changed = threading.Condition()
        self._outstanding = 0
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="valuation", daemon=True)
        self._thread.start()

    @property
    def outstanding(self) -> int:
        with self._changed:
            return self._outstanding

    def submit(self, pending: PendingRound) -> None:
        with self._changed:
            self._outstanding += 1
            self._metrics.valuation_queue_depth.set(self._outstanding)
        self._jobs.put(pending)

    def _wait(self, done: Callable[[], bool], stop: threading.Event) -> bool:
        with self._changed:
            while not done():
                if stop.is_set() or self.error:
                    return False
                self._changed.wait(timeout=0.2)
        return True

    def wait_for_room(self, stop: threading.Event) -> bool:
        """Block while `capacity` rounds wait for their values; False on stop or a failed valuation."""
        return self._wait(lambda: self._outstanding < self.capacity, stop)

    def drain(self, stop: threading.Event) -> bool:
        """Block until every submitted round has its values; False on stop or a failed valuation."""
        return self._wait(lambda: self._outstanding == 0, stop)

    def close(self, timeout: float = 5.0) -> None:
        """Let the thread end after the round it is valuing (if any); the rest stays pending."""
        while True:  # drop what has not started: it stays pending on disk and in the ledger
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._value(job)
            except Exception as exc:  # never lose the coordinator to one round's valuation
                logger.exception("valuation of round %d failed; it and later rounds stay pending", job.round)
                with self._changed:
                    self.error = f"valuation of round {job.round} failed: {exc}"
                    self._changed.notify_all()
                return

    def _value(self, job: PendingRound) -> None:
        started = time.time()
        spec = self._spec_of(job.round)
        kept = self._store.load_plan(job.round)
        if spec is not None and kept is not None:  # valued before a restart: the same plan, the same values
            spec = kept.replay(spec)
        values = value_updates(
            self._model,
            job.params,
            job.updates,
            self._validation,
            job.round,
            spec,
            self._accounting,
            self._game_settings,
            on_plan=None if kept is not None else (lambda plan: self._store.save_plan(job.round, plan)),
        )
        self._ledger.commit_values(job.round, value_rows(values), valuation_summary(values, time.time()))
        self._store.remove(job.round)
        with self._changed:
            self._outstanding -= 1
            backlog = self._outstanding
            self._metrics.valuation_queue_depth.set(backlog)
            self._changed.notify_all()
        record = self._ledger.round_record(job.round)
        self._metrics.observe_values(record, self._accounting.totals(), lag_rounds=backlog)
        logger.info(
            "round %d valued: %s %.2fs, %.2fs after its commit",
            job.round,
            values.method,
            time.time() - started,
            record.valuation_lag_seconds,
        )
