"""One rank's life: join, take round tasks, train locally, stream the delta back; reconnect when cut off."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Iterator

import grpc
from torch import Tensor

from fedsv.common.call_settings import CLIENT_KEEPALIVE, sender_metadata
from fedsv.common.data.sources import Samples
from fedsv.common.limits import DEFAULT_CHUNK_BYTES, GRPC_MESSAGE_BYTES, MAX_CHUNK_BYTES, MAX_TENSOR_SET_BYTES
from fedsv.common.task import LoadedTask
from fedsv.common.tls import channel_credentials
from fedsv.common.v1 import fedsv_pb2, fedsv_pb2_grpc
from fedsv.common.wire import TensorSetAssembler, encode_tensor_set, iter_chunks
from fedsv.participant.local import LocalRank, LocalSettings, LocalSetupError

logger = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
    *CLIENT_KEEPALIVE,  # in step with the coordinator's keepalive policy (fedsv.common.call_settings)
    # The channel's own reconnect backoff (gRPC's default grows to 120 s): while it waits, every call
    # fails at once, so a coordinator back after a restart would be found only that late. Keep it
    # within Backoff's cap.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.NOT_FOUND,  # a restarted coordinator no longer knows our session: join again
    grpc.StatusCode.UNAUTHENTICATED,  # our session token was replaced: join again
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # too many calls at once (e.g. our old stream still closing)
}
# An update refused for these is sent again, with backoff, while its round is open.
RESUBMIT = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}
# A Join refused for who we are (credential, token, certificate) will be refused again: give up.
JOIN_REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


class JoinRefused(Exception):
    """The coordinator refused who we are at Join: trying again cannot help."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"{code.name} {details or ''}".strip())
        self.code = code


class Backoff:
    """Exponential backoff with jitter between reconnection attempts."""

    def __init__(self, first: float = 0.2, cap: float = 5.0, seed: int = 0) -> None:
        self.first, self.cap, self.delay = first, cap, first
        self._random = random.Random(seed)

    def next(self) -> float:
        delay = self.delay * (0.5 + self._random.random() / 2)
        self.delay = min(self.cap, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = self.first


class RankWorker:
    """Plays one rank of the run until the coordinator ends it (or `give_up_after` seconds unreachable)."""

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
        self.local_settings = local or LocalSettings()
        self._task, self._samples = task, samples
        self.tls_dir, self.token, self.server_name = tls_dir, token, server_name
        self.stop = stop or threading.Event()
        self.rounds_trained: list[int] = []
        self._local: LocalRank | None = None

    def run(self) -> str:
        """Returns the coordinator's end reason, or why this rank gave up."""
        backoff = Backoff(seed=self.rank)
        last_contact = self.joined_at = time.time()
        with self._channel() as channel:
            stub = fedsv_pb2_grpc.CoordinatorStub(channel)
            while not self.stop.is_set():
                session_started = time.time()
                try:
                    reason = self._session(stub)
                    if reason is not None:
                        return reason
                    backoff.reset()
                    last_contact = time.time()
                except JoinRefused as exc:
                    logger.error("rank %d: coordinator refused our Join: %s", self.rank, exc)
                    return f"refused: {exc.code.name}"
                except LocalSetupError as exc:
                    logger.error("rank %d: cannot take part: %s", self.rank, exc)
                    return f"error: {exc}"
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code not in RETRYABLE:
                        logger.error("rank %d: coordinator refused us: %s %s", self.rank, code, exc.details())
                        return f"refused: {code.name}"
                    if self.joined_at >= session_started:  # we reached it: unreachable only from now on
                        last_contact = time.time()
                        backoff.reset()
                    if time.time() - last_contact > self.give_up_after:
                        return "gave up: coordinator unreachable"
                    delay = backoff.next()
                    logger.info("rank %d: %s; reconnecting in %.1fs", self.rank, code.name, delay)
                    self.stop.wait(delay)
        return "stopped"

    def _channel(self) -> grpc.Channel:
        if not self.tls_dir:
            return grpc.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        credentials, mutual = channel_credentials(self.tls_dir, self.rank)
        options: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        logger.info("rank %d: TLS to %s (%s)", self.rank, self.target, "mutual" if mutual else "server only")
        return grpc.secure_channel(self.target, credentials, options=options)

    def _join(self, stub: fedsv_pb2_grpc.CoordinatorStub, num_samples: int) -> fedsv_pb2.JoinReply:
        """Join as this rank, declaring `num_samples` (0 while a simulated shard is not derived yet)."""
        try:
            reply: fedsv_pb2.JoinReply = stub.Join(
                fedsv_pb2.JoinRequest(
                    rank=self.rank,
                    world_size=self.world_size,
                    num_samples=num_samples,
                    credential=self.credential,
                    host=socket.gethostname(),
                    participant_token=self.token,
                ),
                timeout=30,
            )
        except grpc.RpcError as exc:
            if exc.code() in JOIN_REFUSED:
                raise JoinRefused(exc.code(), exc.details()) from exc
            raise
        self.joined_at = time.time()
        return reply

    def _session(self, stub: fedsv_pb2_grpc.CoordinatorStub) -> str | None:
        """Join and follow the task stream; None if the stream ended without the end of the run."""
        known = self._local.samples if self._local else self._samples
        reply = self._join(stub, len(known) if known is not None else 0)
        if self._local is None:
            self._local = LocalRank.prepare(
                self.rank, reply.run, self.local_settings, self._task, self._samples
            )
            logger.info("rank %d: %d local samples", self.rank, len(self._local.samples))
            if known is None:  # the shard is derived now: declare its size
                reply = self._join(stub, len(self._local.samples))
        assembler: TensorSetAssembler | None = None
        task: fedsv_pb2.RoundTask | None = None
        received = 0
        for event in stub.Subscribe(
            fedsv_pb2.SubscribeRequest(participant_id=reply.participant_id, session_token=reply.session_token)
        ):
            kind = event.WhichOneof("kind")
            if kind == "end":
                logger.info("rank %d: run ended (%s)", self.rank, event.end.reason)
                return event.end.reason or "finished"
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
                params = assembler.finish()
                self._train_and_submit(stub, reply, task, params)
                task, assembler = None, None
            if self.stop.is_set():
                return "stopped"
        return None

    def _train_and_submit(
        self,
        stub: fedsv_pb2_grpc.CoordinatorStub,
        reply: fedsv_pb2.JoinReply,
        task: fedsv_pb2.RoundTask,
        params: dict[str, Tensor],
    ) -> None:
        local = self._local
        assert local is not None
        started = time.time()
        delta = local.train(params, task, reply.run.train)
        seconds = time.time() - started
        chunk_bytes = min(reply.run.max_chunk_bytes or DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_BYTES)
        header, payloads = encode_tensor_set(delta, chunk_bytes=chunk_bytes)

        def messages() -> Iterator[fedsv_pb2.UpdateMessage]:
            yield fedsv_pb2.UpdateMessage(
                header=fedsv_pb2.UpdateHeader(
                    participant_id=reply.participant_id,
                    session_token=reply.session_token,
                    round=task.round,
                    num_samples=len(local.samples),
                    delta=header,
                    train_seconds=seconds,
                )
            )
            for chunk in iter_chunks(header, payloads):
                yield fedsv_pb2.UpdateMessage(chunk=chunk)

        deadline = task.deadline_unix_ms / 1000
        backoff = Backoff(first=0.2, cap=2.0, seed=self.rank)
        while True:
            try:
                stub.SubmitUpdate(
                    messages(),
                    timeout=max(5.0, deadline - time.time() + 30),
                    metadata=sender_metadata(reply.participant_id, reply.session_token),
                )
                self.rounds_trained.append(task.round)
                logger.info("rank %d: round %d delta sent (%.2fs training)", self.rank, task.round, seconds)
                return
            except grpc.RpcError as exc:
                code = exc.code()
                delay = backoff.next()
                if code in RESUBMIT and time.time() + delay < deadline and not self.stop.is_set():
                    # Refused for capacity (RESOURCE_EXHAUSTED) or not reached (UNAVAILABLE): the
                    # round is still open, so the same update is sent again after a backoff.
                    logger.info(
                        "rank %d: round %d update %s; again in %.1fs", self.rank, task.round, code, delay
                    )
                    self.stop.wait(delay)
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                logger.warning(
                    "rank %d: round %d update rejected: %s %s", self.rank, task.round, code, exc.details()
                )
                return
