"""One rank's life: join, take round tasks, train locally, stream the delta back; reconnect when cut off."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Iterator

import grpc

from fedsv.common.limits import DEFAULT_CHUNK_BYTES, GRPC_MESSAGE_BYTES, MAX_CHUNK_BYTES, MAX_TENSOR_SET_BYTES
from fedsv.common.models import build_model
from fedsv.common.shards import cached_splits, load_shard
from fedsv.common.tls import channel_credentials
from fedsv.common.training import TrainConfig, local_update
from fedsv.common.v1 import fedsv_pb2, fedsv_pb2_grpc
from fedsv.common.wire import TensorSetAssembler, encode_tensor_set, iter_chunks

logger = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
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
# A Join refused for who we are (credential, token, certificate) will be refused again: give up.
JOIN_REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
# local_update seeds torch's process-global RNG (dropout): ranks of one process train one at a time so
# every rank's delta is the same whichever ranks share its process. Processes give the parallelism.
_TRAIN_LOCK = threading.Lock()


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
        data_dir: str = "",
        give_up_after: float = 600.0,
        stop: threading.Event | None = None,
        tls_dir: str = "",
        token: str = "",
        server_name: str = "",
    ) -> None:
        """tls_dir "" means plaintext; otherwise trust its ca.pem and present pNNN.pem/.key if it has them.
        `token` is the rank's own participant token (runs with per-participant tokens)."""
        self.target, self.rank, self.world_size = target, rank, world_size
        self.credential, self.data_dir, self.give_up_after = credential, data_dir, give_up_after
        self.tls_dir, self.token, self.server_name = tls_dir, token, server_name
        self.stop = stop or threading.Event()
        self.rounds_trained: list[int] = []
        self._shard: tuple | None = None  # (shard, corruption, model, train config)

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

    def _session(self, stub: fedsv_pb2_grpc.CoordinatorStub) -> str | None:
        """Join and follow the task stream; None if the stream ended without the end of the run."""
        num_samples = len(self._shard[0]) if self._shard else 0
        try:
            reply = stub.Join(
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
        if self._shard is None:
            self._prepare(reply.run)
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

    def _prepare(self, run: fedsv_pb2.RunSpec) -> None:
        splits = cached_splits(run.dataset, self.data_dir, run.seed, run.validation_size)
        shard, corruption = load_shard(
            splits, self.rank, run.world_size, run.partition, run.seed, run.corruption
        )
        model = build_model(run.model, splits.input_shape, splits.num_classes, seed=run.seed)
        config = TrainConfig(
            epochs=run.train.epochs,
            batch_size=run.train.batch_size,
            lr=run.train.lr,
            momentum=run.train.momentum,
            weight_decay=run.train.weight_decay,
        )
        self._shard = (shard, corruption, model, config)
        logger.info("rank %d: %d local samples (%s)", self.rank, len(shard), run.corruption)

    def _train_and_submit(
        self,
        stub: fedsv_pb2_grpc.CoordinatorStub,
        reply: fedsv_pb2.JoinReply,
        task: fedsv_pb2.RoundTask,
        params: dict,
    ) -> None:
        assert self._shard is not None
        shard, corruption, model, config = self._shard
        with _TRAIN_LOCK:
            started = time.time()
            delta = local_update(
                model, params, shard.x, shard.y, config, seed=task.train_seed, corruption=corruption
            )
            seconds = time.time() - started
        chunk_bytes = min(reply.run.max_chunk_bytes or DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_BYTES)
        header, payloads = encode_tensor_set(delta, chunk_bytes=chunk_bytes)

        def messages() -> Iterator[fedsv_pb2.UpdateMessage]:
            yield fedsv_pb2.UpdateMessage(
                header=fedsv_pb2.UpdateHeader(
                    participant_id=reply.participant_id,
                    session_token=reply.session_token,
                    round=task.round,
                    num_samples=len(shard),
                    delta=header,
                    train_seconds=seconds,
                )
            )
            for chunk in iter_chunks(header, payloads):
                yield fedsv_pb2.UpdateMessage(chunk=chunk)

        timeout = max(5.0, task.deadline_unix_ms / 1000 - time.time() + 30)
        try:
            stub.SubmitUpdate(messages(), timeout=timeout)
            self.rounds_trained.append(task.round)
            logger.info("rank %d: round %d delta sent (%.2fs training)", self.rank, task.round, seconds)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
            logger.warning(
                "rank %d: round %d update rejected: %s %s", self.rank, task.round, code, exc.details()
            )
