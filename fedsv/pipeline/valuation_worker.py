"""Background valuation: committed rounds, in round order, valued by an idle-priority process, then recorded.

The worker lags rather than degrades: rounds wait for their values on disk (pending.PendingStore), as
many as `backlog_bytes` of inputs hold, and the round loop holds back only when that bound is reached.
Each round is valued to the run's accuracy target or exactly, however long the backlog; after the
last round the run finishes the backlog before it reports. Whenever it has caught up, the process also
completes the values of the rounds so far (the completed values, for the live metrics).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch

from fedsv.ledger import Ledger, class_rows, valuation_summary, value_rows
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.pending import PendingStore
from fedsv.pipeline.valuation_process import (
    Complete,
    CompletedReply,
    Done,
    Failed,
    Job,
    Settings,
    ValuationSetup,
    serve,
)
from fedsv.valuation import FederatedValuation, RoundValues, ValuationSpec
from fedsv.valuation.round_valuation import GameSettings

logger = logging.getLogger(__name__)

WARM_UP = 0
"""The job that starts the valuation process before any round (rounds are numbered from 1)."""


_MAIN_SWAP = threading.Lock()


@contextlib.contextmanager
def without_main() -> Iterator[None]:
    """While a spawned process starts, show multiprocessing a bare __main__ (no file, no spec), so the
    child imports nothing of the parent's main script or module."""
    with _MAIN_SWAP:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


class ValuationWorker:
    """One thread that hands the rounds submitted to it to the valuation process, one at a time in
    round order, commits each round's values, adds them to `accounting` and drops their inputs.

    `on_valued` sees each round's values once they are committed (in the worker's thread). The process
    starts at warm_up() or with the first round. A valuation that fails stops the worker:
    later rounds stay pending, in the ledger and on disk, and a restarted coordinator values them again.
    """

    def __init__(
        self,
        setup: ValuationSetup,
        game_settings: GameSettings,
        spec_of: Callable[[int], ValuationSpec | None],
        accounting: FederatedValuation,
        ledger: Ledger,
        metrics: RunMetrics,
        store: PendingStore,
        backlog_bytes: int | None = None,  # None: no bound (--valuation-backlog-bytes sets the coordinator's)
        threads: int = 0,
        on_valued: Callable[[RoundValues], None] | None = None,
    ) -> None:
        self._settings = Settings(
            setup,
            str(store.directory),
            game_settings,
            threads or torch.get_num_threads(),
            logger.getEffectiveLevel(),
        )
        self._spec_of, self._accounting, self._ledger = spec_of, accounting, ledger
        self._metrics, self._store = metrics, store
        self._on_valued = on_valued
        self.backlog_bytes = backlog_bytes
        self._jobs: queue.Queue[int | None] = queue.Queue()
        self._changed = threading.Condition()
        self._sizes: dict[int, int] = {}  # outstanding rounds -> bytes of their inputs on disk
        self._completing = False  # caught up, the process is completing the values
        self._closing = threading.Event()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="valuation", daemon=True)
        self._thread.start()

    @property
    def process_pid(self) -> int | None:
        """The valuation process's pid once it started (None before the first round)."""
        return None if self._process is None else self._process.pid

    @property
    def outstanding(self) -> int:
        with self._changed:
            return len(self._sizes)

    @property
    def outstanding_bytes(self) -> int:
        with self._changed:
            return sum(self._sizes.values())

    def warm_up(self) -> None:
        """Start the valuation process now (it loads the model and data) rather than with round 1."""
        self._jobs.put(WARM_UP)

    def submit(self, number: int) -> None:
        """Value round `number`, whose inputs the store holds."""
        size = self._store.size(number)
        with self._changed:
            self._sizes[number] = size
            self._metrics.valuation_queue_depth.set(len(self._sizes))
            self._metrics.valuation_backlog_bytes.set(sum(self._sizes.values()))
        self._jobs.put(number)

    def _wait(self, done: Callable[[], bool], stop: threading.Event) -> bool:
        with self._changed:
            while not self.error and not done():
                if stop.is_set():
                    return False
                self._changed.wait(timeout=0.2)
            return not self.error

    def wait_for_room(self, stop: threading.Event) -> bool:
        """Block while the backlog's inputs take `backlog_bytes` or more; False on stop or a failure."""
        bound = self.backlog_bytes
        return self._wait(lambda: bound is None or not self._sizes or sum(self._sizes.values()) < bound, stop)

    def drain(self, stop: threading.Event, progress: Callable[[int], None] | None = None) -> bool:
        """Block until every submitted round has its values (`progress` sees the rounds left as they
        fall); False on stop or a failed valuation."""
        last = -1

        def done() -> bool:
            nonlocal last
            if progress is not None and len(self._sizes) != last:
                last = len(self._sizes)
                progress(last)
            return not self._sizes

        return self._wait(done, stop)

    def settle(self, stop: threading.Event) -> bool:
        """After drain(): block until the completed values of every round are in the metrics too (the
        process completes them once caught up); False on stop or a failure."""
        return self._wait(lambda: not self._sizes and not self._completing, stop)

    def close(self, timeout: float = 10.0) -> None:
        """Stop: the round being valued (if any) is abandoned; it and the rest stay pending on disk."""
        self._closing.set()
        self._jobs.put(None)
        self._thread.join(timeout)
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()
            process.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                number = self._jobs.get()
                if number is None:
                    break
                if number == WARM_UP:
                    self._start()
                    continue
                self._value(number)
        except Exception as exc:  # never lose the coordinator to one round's valuation
            logger.exception("valuation stopped; the rounds left stay pending")
            with self._changed:
                self.error = str(exc)
                self._changed.notify_all()
        finally:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send(None)

    def _start(self) -> Connection:
        """The valuation process, started on first use (spawned: a fresh interpreter, which does not run
        the parent's __main__: a script without an `if __name__ == "__main__":` guard, as Flower
        simulations often are, would otherwise start its whole run again in the child)."""
        if self._conn is None:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            self._process = context.Process(
                target=serve, args=(child, self._settings), name="fedsv-valuation"
            )
            self._process.daemon = True
            with without_main():
                self._process.start()
            child.close()
            self._conn = parent
        return self._conn

    def _ask(self, job: Job | Complete, what: str) -> object:
        """Send `job` to the process and wait for its reply (None when the worker is closing)."""
        conn = self._start()
        conn.send(job)
        while not conn.poll(0.2):
            if self._closing.is_set():
                return None
            if self._process is not None and not self._process.is_alive():
                raise RuntimeError(f"the valuation process died {what}")
        return conn.recv()

    def _value(self, number: int) -> None:
        started = time.time()
        spec = self._spec_of(number)
        kept = self._store.load_plan(number)
        if spec is not None and kept is not None:  # valued before a restart: the same plan, the same values
            spec = kept.replay(spec)
        reply = self._ask(Job(number, spec, keep_plan=kept is None), f"valuing round {number}")
        if reply is None:
            return
        if isinstance(reply, Failed):
            raise RuntimeError(f"valuation of round {number} failed: {reply.error}")
        assert isinstance(reply, Done) and reply.round == number, reply
        values = reply.values
        summary = valuation_summary(values, time.time())
        self._ledger.commit_values(number, value_rows(values), summary, class_rows(values))
        self._accounting.add_round(values)
        self._store.remove(number)
        if self._on_valued is not None:  # before drain() can see the round done
            self._on_valued(values)
        with self._changed:
            self._sizes.pop(number, None)
            backlog = len(self._sizes)
            self._completing = backlog == 0 and self._jobs.empty()  # caught up: refresh the completed values
            self._metrics.valuation_queue_depth.set(backlog)
            self._metrics.valuation_backlog_bytes.set(sum(self._sizes.values()))
            self._changed.notify_all()
        record = self._ledger.round_record(number)
        totals, errors = self._accounting.sums(), self._accounting.sum_errors()
        self._metrics.observe_values(record, totals, lag_rounds=backlog, errors=errors, alike=values.alike)
        logger.info(
            "round %d valued: %s, %d evaluations, largest stderr %.2g, %.2fs, %.2fs after its commit",
            number,
            values.method,
            values.evaluations,
            values.max_stderr,
            time.time() - started,
            record.valuation_lag_seconds,
        )
        if self._completing:
            try:
                self._complete()
            finally:
                with self._changed:
                    self._completing = False
                    self._changed.notify_all()

    def _complete(self) -> None:
        """Complete the values of the rounds so far and show them (a failure is logged, not fatal; a
        close() abandons it: the report completes the values again from the ledger)."""
        reply = self._ask(Complete(self._accounting.matrices()), "completing the values")
        if isinstance(reply, CompletedReply):
            self._accounting.adopt(reply.matrix, reply.completed, reply.errors)
            # per participant (an owner's completed total split among its participants: owners.py)
            completed = self._accounting.totals()["fedsv_completed"]
            self._metrics.observe_completed(completed, self._accounting.errors(), reply.seconds)
        elif isinstance(reply, Failed):
            logger.warning("completed values not updated after %d rounds: %s", reply.round, reply.error)
