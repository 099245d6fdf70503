"""The thin gRPC servicer: decode, count bytes, hand off to RunState, map rejections to status codes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from coordinator.metrics import CoordinatorMetrics
from coordinator.run_state import Rejected, RunState
from fedsv.v1 import fedsv_pb2, fedsv_pb2_grpc
from fedsv.wire import TensorSetAssembler, WireError, iter_chunks

logger = logging.getLogger(__name__)

WIRE_CODES = {
    "bad_header": grpc.StatusCode.INVALID_ARGUMENT,
    "unexpected_tensors": grpc.StatusCode.INVALID_ARGUMENT,
    "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "bad_chunk": grpc.StatusCode.INVALID_ARGUMENT,
    "incomplete": grpc.StatusCode.INVALID_ARGUMENT,
    "checksum_mismatch": grpc.StatusCode.DATA_LOSS,
    "non_finite": grpc.StatusCode.INVALID_ARGUMENT,
}


class CoordinatorServicer(fedsv_pb2_grpc.CoordinatorServicer):
    """Join, Subscribe and SubmitUpdate over a RunState; every byte in and out is counted."""

    def __init__(
        self,
        state: RunState,
        run_spec: Callable[[int], fedsv_pb2.RunSpec],
        model_spec: dict[str, tuple[str, tuple[int, ...]]],
        metrics: CoordinatorMetrics,
        max_chunk_bytes: int,
        max_update_bytes: int,
    ) -> None:
        self.state = state
        self.run_spec = run_spec
        self.model_spec = model_spec
        self.metrics = metrics
        self.max_chunk_bytes = max_chunk_bytes
        self.max_update_bytes = max_update_bytes

    # ------------------------------------------------------------------ helpers
    def _count(self, round_number: int, rpc: str, direction: str, message: Any) -> None:
        size = message.ByteSize()
        self.state.count(round_number, rpc, direction, size)
        self.metrics.record_rpc(rpc, direction, size)

    def _abort(
        self, context: grpc.ServicerContext, reason: str, code: grpc.StatusCode, message: str
    ) -> NoReturn:
        self.metrics.reject(reason)
        logger.info("rejected (%s): %s", reason, message)
        context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort raises

    def _rejected(self, context: grpc.ServicerContext, exc: Rejected) -> NoReturn:
        self._abort(context, exc.reason, grpc.StatusCode[exc.code], str(exc))

    # ------------------------------------------------------------------ RPCs
    def Join(self, request: fedsv_pb2.JoinRequest, context: grpc.ServicerContext) -> fedsv_pb2.JoinReply:
        number = self.state.current_round_number()
        self._count(number, "Join", "up", request)
        try:
            info = self.state.join(request.rank, request.world_size, request.credential, request.host)
        except Rejected as exc:
            self._rejected(context, exc)
        reply = fedsv_pb2.JoinReply(
            participant_id=info.participant_id, session_token=info.token, run=self.run_spec(info.rank)
        )
        self._count(number, "Join", "down", reply)
        logger.info("rank %d joined as %s from %s", request.rank, info.participant_id, request.host or "?")
        return reply

    def Subscribe(
        self, request: fedsv_pb2.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[fedsv_pb2.ServerEvent]:
        self._count(self.state.current_round_number(), "Subscribe", "up", request)
        try:
            info = self.state.authenticate(request.participant_id, request.session_token)
        except Rejected as exc:
            self._rejected(context, exc)
        self.state.stream_opened(info, +1)
        sent_round = 0
        try:
            while context.is_active():
                with self.state.cond:
                    self.state.cond.wait_for(
                        lambda after=sent_round: (  # type: ignore[misc]
                            self.state.finished or self.state.task_for(info.participant_id, after) is not None
                        ),
                        timeout=1.0,
                    )
                    task = self.state.task_for(info.participant_id, sent_round)
                    finished = self.state.finished
                    completed = self.state.rounds_completed
                if task is not None:
                    sent_round = task.round
                    event = fedsv_pb2.ServerEvent(
                        task=fedsv_pb2.RoundTask(
                            round=task.round,
                            deadline_unix_ms=int(task.deadline * 1000),
                            model=task.task_header,  # type: ignore[arg-type]
                            train_seed=task.train_seeds[info.participant_id],
                        )
                    )
                    self._count(task.round, "Subscribe", "down", event)
                    yield event
                    for chunk in iter_chunks(task.task_header, task.task_payloads):  # type: ignore[arg-type]
                        event = fedsv_pb2.ServerEvent(chunk=chunk)
                        self._count(task.round, "Subscribe", "down", event)
                        yield event
                elif finished:
                    event = fedsv_pb2.ServerEvent(
                        end=fedsv_pb2.RunEnd(reason=self.state.end_reason, rounds_completed=completed)
                    )
                    self._count(completed, "Subscribe", "down", event)
                    yield event
                    return
        finally:
            self.state.stream_opened(info, -1)

    def SubmitUpdate(
        self, request_iterator: Iterator[fedsv_pb2.UpdateMessage], context: grpc.ServicerContext
    ) -> fedsv_pb2.SubmitReply:
        number = self.state.current_round_number()
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "header":
            self._abort(
                context, "bad_header", grpc.StatusCode.INVALID_ARGUMENT, "an update must start with a header"
            )
        header = first.header
        number = header.round
        self._count(number, "SubmitUpdate", "up", first)
        try:
            info = self.state.authenticate(header.participant_id, header.session_token)
            self.state.check_update(info, header.round, header.num_samples)
            assembler = TensorSetAssembler(
                header.delta,
                max_total_bytes=self.max_update_bytes,
                max_chunk_bytes=self.max_chunk_bytes,
                expected=self.model_spec,
            )
            for message in request_iterator:
                self._count(number, "SubmitUpdate", "up", message)
                if message.WhichOneof("kind") != "chunk":
                    raise WireError("bad_chunk", "only chunks may follow the update header")
                assembler.add(message.chunk)
            delta = assembler.finish(require_finite=True)
            self.state.accept_update(info, header.round, delta, header.num_samples, header.train_seconds)
        except Rejected as exc:
            self._rejected(context, exc)
        except WireError as exc:
            self._abort(
                context, exc.reason, WIRE_CODES.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT), str(exc)
            )
        reply = fedsv_pb2.SubmitReply(
            accepted=True, round=header.round, bytes_received=header.delta.total_bytes
        )
        self._count(number, "SubmitUpdate", "down", reply)
        return reply
