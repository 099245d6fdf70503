"""One rank's life as a coroutine: join, take tasks, train in the pool, stream the delta back; reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from torch import Tensor

from fedsv.data.sources import Samples
from fedsv.participant.config import ParticipantConfig
from fedsv.participant.local import LocalRank, LocalSettings, LocalSetupError
from fedsv.participant.results import STOPPED, RankEnd, RankResult
from fedsv.participant.retry import (
    JOIN_REFUSED,
    RESUBMIT,
    RETRYABLE,
    Backoff,
    JoinRefused,
    sleep_unless_stopped,
)
from fedsv.participant.shared import Shared
from fedsv.settings.run_spec import from_run_spec
from fedsv.task.interface import LoadedTask
from fedsv.wire.call_settings import sender_metadata
from fedsv.wire.codec import ChunkPayloads, TensorSetAssembler, encode_tensor_set, iter_chunks
from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, MAX_TENSOR_SET_BYTES
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc

logger = logging.getLogger(__name__)

Metadata = Sequence[tuple[str, str]]


class RankWorker:
    """Plays one rank of the run until the coordinator ends it (or `give_up_after` seconds unreachable).

    `play` is the rank as a coroutine on a process's event loop (`fedsv.participant.host.RankHost`
    runs thousands of them); `run` plays it alone, blocking, on an event loop of its own."""

    def __init__(
        self,
        target: str,
        rank: int,
        world_size: int,
        *,
        credential: str = "",
        local: LocalSettings | None = None,
        task: LoadedTask | None = None,
        samples: Samples | None = None,
        give_up_after: float = 600.0,
        stop: threading.Event | None = None,
        tls_dir: str = "",
        token: str = "",
        server_name: str = "",
    ) -> None:
        """tls_dir "" means plaintext; otherwise trust its ca.pem and present pNNN.pem/.key if it has them.
        `token` is the rank's own participant token (runs with per-participant tokens). `local` says
        which task and data the rank uses; `task` and `samples`, when given, are already loaded."""
        self.target, self.rank, self.world_size = target, rank, world_size
        self.credential, self.give_up_after = credential, give_up_after
        self.local_settings = local or ParticipantConfig.default_local()
        self._task, self._samples = task, samples
        self.tls_dir, self.token, self.server_name = tls_dir, token, server_name
        self.stop = stop or threading.Event()
        self.rounds_trained: list[int] = []
        self._local: LocalRank | None = None

    async def play(self, shared: Shared) -> RankResult:
        """Returns the coordinator's end reason, or why this rank gave up."""
        backoff = Backoff(seed=self.rank)
        last_contact = self.joined_at = time.time()
        stub = fedsv_pb2_grpc.CoordinatorStub(shared.channels.channel(self.rank))
        while not self.stop.is_set():
            session_started = time.time()
            try:
                reason = await self._session(stub, shared)
                if reason is not None:
                    return reason
                backoff.reset()
                last_contact = time.time()
            except JoinRefused as exc:
                logger.error("rank %d: coordinator refused our Join: %s", self.rank, exc)
                return RankResult(RankEnd.REFUSED, exc.code.name)
            except LocalSetupError as exc:
                logger.error("rank %d: cannot take part: %s", self.rank, exc)
                return RankResult(RankEnd.ERROR, str(exc))
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in RETRYABLE:
                    logger.error("rank %d: coordinator refused us: %s %s", self.rank, code, exc.details())
                    return RankResult(RankEnd.REFUSED, code.name)
                if self.joined_at >= session_started:  # we reached it: unreachable only from now on
                    last_contact = time.time()
                    backoff.reset()
                if time.time() - last_contact > self.give_up_after:
                    logger.error(
                        "rank %d: gave up: coordinator %s unreachable for %.0f s (--give-up-after; last: %s)",
                        self.rank, self.target, self.give_up_after, code.name,
                    )  # fmt: skip
                    return RankResult(RankEnd.GAVE_UP, "coordinator unreachable")
                delay = backoff.next()  # jittered: a burst of ranks cut off together comes back spread out
                logger.info("rank %d: %s; reconnecting in %.1fs", self.rank, code.name, delay)
                await sleep_unless_stopped(self.stop, delay)
        return STOPPED

    async def _join(self, stub: Any, shared: Shared, num_samples: int) -> fedsv_pb2.JoinReply:
        """Join as this rank, declaring `num_samples` (0 while a simulated shard is not derived yet)."""
        request = fedsv_pb2.JoinRequest(
            rank=self.rank,
            world_size=self.world_size,
            num_samples=num_samples,
            credential=self.credential,
            host=socket.gethostname(),
            participant_token=self.token,
        )
        try:
            async with shared.join_slots:
                reply: fedsv_pb2.JoinReply = await stub.Join(request, timeout=30)
        except grpc.RpcError as exc:
            if exc.code() in JOIN_REFUSED:
                raise JoinRefused(exc.code(), exc.details()) from exc
            raise
        self.joined_at = time.time()
        return reply

    async def _session(self, stub: Any, shared: Shared) -> RankResult | None:
        """Join and follow the task stream; None if the stream ended without the end of the run."""
        if self._local is not None:
            count = self._local.declared_samples
        else:
            count = len(self._samples) if self._samples is not None else 0
        reply = await self._join(stub, shared, count)
        if self._local is None:
            self._local = await asyncio.get_running_loop().run_in_executor(
                shared.executor,
                LocalRank.prepare,
                self.rank,
                from_run_spec(reply.run),
                self.local_settings,
                self._task,
                self._samples,
            )
            logger.info("rank %d: %d local samples", self.rank, len(self._local.samples))
            if count == 0:  # the shard is derived now: declare its size
                reply = await self._join(stub, shared, self._local.declared_samples)
        assembler: TensorSetAssembler | None = None
        task: fedsv_pb2.RoundTask | None = None
        received = 0
        call = stub.Subscribe(
            fedsv_pb2.SubscribeRequest(participant_id=reply.participant_id, session_token=reply.session_token)
        )
        try:
            async for event in call:
                kind = event.WhichOneof("kind")
                if kind == "end":
                    logger.info("rank %d: run ended (%s)", self.rank, event.end.reason)
                    await _let_close(call)
                    return RankResult.from_coordinator(event.end.reason)
                if kind == "task":
                    task, received = event.task, 0
                    assembler = TensorSetAssembler(
                        task.model,
                        max_total_bytes=MAX_TENSOR_SET_BYTES,
                        max_chunk_bytes=reply.run.max_chunk_bytes or MAX_CHUNK_BYTES,
                    )
                elif kind == "chunk" and assembler is not None and task is not None:
                    assembler.add(event.chunk)
                    received += 1
                if task is not None and assembler is not None and received == task.model.num_chunks:
                    await self._train_and_submit(stub, shared, reply, task, assembler)
                    task, assembler = None, None
                if self.stop.is_set():
                    return STOPPED
        finally:
            call.cancel()  # a no-op once the stream ended; else the server sees the client go away
        return None

    async def _train_and_submit(
        self,
        stub: Any,
        shared: Shared,
        reply: fedsv_pb2.JoinReply,
        task: fedsv_pb2.RoundTask,
        assembler: TensorSetAssembler,
    ) -> None:
        local = self._local
        assert local is not None
        run = from_run_spec(reply.run)
        chunk_bytes = min(run.max_chunk_bytes or DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_BYTES)

        def train() -> tuple[fedsv_pb2.TensorSetHeader, ChunkPayloads, float]:
            """CPU work, run in the pool: the event loop (every other rank) stays responsive."""
            params: dict[str, Tensor] = assembler.finish()
            started = time.time()
            delta = local.train(params, task, run)
            seconds = time.time() - started
            header, payloads = encode_tensor_set(delta, chunk_bytes=chunk_bytes)
            return header, payloads, seconds

        header, payloads, seconds = await asyncio.get_running_loop().run_in_executor(shared.executor, train)

        def messages() -> Iterator[fedsv_pb2.UpdateMessage]:
            yield fedsv_pb2.UpdateMessage(
                header=fedsv_pb2.UpdateHeader(
                    participant_id=reply.participant_id,
                    session_token=reply.session_token,
                    round=task.round,
                    num_samples=local.declared_samples,
                    delta=header,
                    train_seconds=seconds,
                )
            )
            for chunk in iter_chunks(header, payloads):
                yield fedsv_pb2.UpdateMessage(chunk=chunk)

        deadline = task.deadline_unix_ms / 1000
        backoff = Backoff(first=0.2, cap=2.0, seed=self.rank)
        metadata = sender_metadata(reply.participant_id, reply.session_token)
        while True:
            try:
                await self._send(stub, messages(), max(5.0, deadline - time.time() + 30), metadata)
                self.rounds_trained.append(task.round)
                logger.info("rank %d: round %d delta sent (%.2fs training)", self.rank, task.round, seconds)
                return
            except grpc.RpcError as exc:
                code = exc.code()
                delay = backoff.next()
                if code in RESUBMIT and time.time() + delay < deadline and not self.stop.is_set():
                    # Refused for capacity (RESOURCE_EXHAUSTED), not reached (UNAVAILABLE) or cut by the
                    # transport (INTERNAL): the round is still open, so the same update is sent again.
                    logger.info(
                        "rank %d: round %d update %s; again in %.1fs", self.rank, task.round, code, delay
                    )
                    await sleep_unless_stopped(self.stop, delay)
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                logger.warning(
                    "rank %d: round %d update rejected: %s %s", self.rank, task.round, code, exc.details()
                )
                return

    async def _send(
        self, stub: Any, messages: Iterator[fedsv_pb2.UpdateMessage], timeout: float, metadata: Metadata
    ) -> fedsv_pb2.SubmitReply:
        """One SubmitUpdate call streaming `messages` (tests replace it to stall an upload)."""
        reply: fedsv_pb2.SubmitReply = await stub.SubmitUpdate(messages, timeout=timeout, metadata=metadata)
        return reply


END_CLOSE_WAIT = 30.0  # seconds to let the coordinator close the task stream after the run's end


async def _let_close(call: Any) -> None:
    """Let the coordinator close the task stream it just sent the run's end on, rather than cancel it:
    the coordinator counts this participant as told only once the stream's generator resumes after
    the end, and a cancel racing that step leaves it waiting out its --end-grace."""
    # A coordinator that keeps the stream open, or drops it: the end was read all the same.
    with contextlib.suppress(TimeoutError, grpc.RpcError):
        await asyncio.wait_for(call.code(), END_CLOSE_WAIT)
