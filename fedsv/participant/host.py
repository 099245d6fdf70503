"""One participant process's ranks as coroutines on one event loop, training in a small thread pool."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from fedsv.participant.results import STOPPED, RankEnd, RankResult
from fedsv.participant.retry import STOP_POLL_SECONDS
from fedsv.participant.shared import ChannelPool, Shared
from fedsv.participant.worker import RankWorker

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 2.0  # after a stop, ranks get this long to finish on their own; then they are cancelled


def default_training_threads() -> int:
    """Threads that train selected ranks: about the process's cores (training holds a lock per
    process, so more would only queue; at least 2, so that encoding overlaps training)."""
    return max(2, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))


class RankHost:
    """Plays `workers` (ranks of one run, one coordinator address and transport) in this thread.

    Each rank is a coroutine; idle ranks wait on their task streams and cost no thread. Ranks without
    a certificate of their own share one grpc.aio channel (`ChannelPool`). A rank's failure never takes
    the other ranks down. `stop` (set by a signal handler, say) ends every rank: each returns
    "stopped"."""

    def __init__(
        self, workers: Sequence[RankWorker], stop: threading.Event, training_threads: int = 0
    ) -> None:
        if not workers:
            raise ValueError("a rank host needs at least one rank")
        first = workers[0]
        for worker in workers:
            if (worker.target, worker.tls_dir, worker.server_name) != (
                first.target,
                first.tls_dir,
                first.server_name,
            ):
                raise ValueError("the ranks of one host must share the coordinator address and transport")
        self.workers = list(workers)
        self.stop = stop
        self.training_threads = training_threads or default_training_threads()

    def run(self) -> dict[int, RankResult]:
        """Play every rank to its end; rank -> how it ended."""
        return asyncio.run(self._main())

    async def _main(self) -> dict[int, RankResult]:
        first = self.workers[0]
        channels = ChannelPool(first.target, first.tls_dir, first.server_name)
        results: dict[int, RankResult] = {}
        executor = ThreadPoolExecutor(self.training_threads, thread_name_prefix="train")
        try:
            shared = Shared(channels, executor)
            tasks = {
                asyncio.create_task(self._play(worker, shared, results), name=f"rank-{worker.rank}"): worker
                for worker in self.workers
            }
            watcher = asyncio.create_task(self._watch_stop(set(tasks)))
            await asyncio.wait(tasks)
            watcher.cancel()
            for task, worker in tasks.items():
                if task.cancelled():
                    results.setdefault(worker.rank, STOPPED)
        finally:
            await channels.close()
            executor.shutdown(wait=False, cancel_futures=True)
        return results

    async def _play(self, worker: RankWorker, shared: Shared, results: dict[int, RankResult]) -> None:
        try:
            results[worker.rank] = await worker.play(shared)
        except asyncio.CancelledError:
            results[worker.rank] = STOPPED
            raise
        except Exception as exc:  # a rank's failure must not take the other ranks of the process down
            logger.exception("rank %d failed", worker.rank)
            results[worker.rank] = RankResult(RankEnd.ERROR, str(exc))
        finally:
            released = shared.channels.release(worker.rank)
            if released is not None:
                await asyncio.shield(released)

    async def _watch_stop(self, tasks: set[asyncio.Task[None]]) -> None:
        """Once `stop` is set, give the ranks a moment to return on their own, then cancel the rest."""
        while not self.stop.is_set():
            await asyncio.sleep(STOP_POLL_SECONDS)
        _, pending = await asyncio.wait(tasks, timeout=STOP_GRACE_SECONDS)
        for task in pending:
            task.cancel()


def run_alone(worker: RankWorker) -> RankResult:
    """Play one rank alone (its own event loop, channel and one training thread); blocks. Returns the
    coordinator's end reason, or why the rank gave up."""
    return RankHost([worker], worker.stop, training_threads=1).run()[worker.rank]
