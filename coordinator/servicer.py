"""The thin gRPC servicer: decode, count bytes, hand off to RunState, map rejections to status codes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from fedsv.common.log_safety import RateLimitedLog, shown
from fedsv.common.tls import peer_identity
from fedsv.common.v1 import fedsv_pb2, fedsv_pb2_grpc
from fedsv.common.wire import TensorSetAssembler, WireError, iter_chunks
from fedsv.coordinator.metrics import CoordinatorMetrics
from fedsv.coordinator.run_state import ParticipantInfo, Rejected, RunState
from fedsv.coordinator.status_codes import status_of

logger = logging.getLogger(__name__)


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
        max_tensors: int = 1024,
    ) -> None:
        self.state = state
        self.run_spec = run_spec
        self.model_spec = model_spec
        self.metrics = metrics
        self.max_chunk_bytes = max_chunk_bytes
        self.max_update_bytes = max_update_bytes
        self.max_tensors = max_tensors
        self._log = RateLimitedLog(logger)

    # ------------------------------------------------------------------ helpers
    def _count(self, round_number: int, rpc: str, direction: str, message: Any) -> None:
        size = message.ByteSize()
        self.state.count(round_number, rpc, direction, size)
        self.metrics.record_rpc(rpc, direction, size)

    def _refuse(self, context: grpc.ServicerContext, reason: str, message: str) -> NoReturn:
        """Count the refusal and end the call with the reason's status code (status_codes.py)."""
        self.metrics.reject(reason)
        message = shown(message)
        self._log.log(logging.INFO, reason, "rejected (%s): %s", reason, message)
        context.abort(status_of(reason), message)
        raise AssertionError("unreachable")  # context.abort raises

    def _receive_update(
        self,
        info: ParticipantInfo,
        header: fedsv_pb2.UpdateHeader,
        request_iterator: Iterator[fedsv_pb2.UpdateMessage],
    ) -> None:
        """Check the update's header, then read, check and hand over its chunks (raises on any fault)."""
        self.state.check_update(info, header.round, header.num_samples)
        assembler = TensorSetAssembler(
            header.delta,
            max_total_bytes=self.max_update_bytes,
            max_chunk_bytes=self.max_chunk_bytes,
            expected=self.model_spec,
            max_tensors=self.max_tensors,
        )
        for message in request_iterator:
            self._count(self.state.current_round_number(), "SubmitUpdate", "up", message)
            if message.WhichOneof("kind") != "chunk":
                raise WireError("bad_chunk", "only chunks may follow the update header")
            assembler.add(message.chunk)
        delta = assembler.finish(require_finite=True)
        self.state.accept_update(info, header.round, delta, header.num_samples, header.train_seconds)

    # ------------------------------------------------------------------ RPCs
    def Join(self, request: fedsv_pb2.JoinRequest, context: grpc.ServicerContext) -> fedsv_pb2.JoinReply:
        number = self.state.current_round_number()
        self._count(number, "Join", "up", request)
        try:
            info = self.state.join(
                request.rank,
                request.world_size,
                request.credential,
                request.host,
                request.participant_token,
                peer_identity(context.auth_context()),
                num_samples=request.num_samples,
            )
        except Rejected as exc:
            self._refuse(context, exc.reason, str(exc))
        reply = fedsv_pb2.JoinReply(
            participant_id=info.participant_id, session_token=info.token, run=self.run_spec(info.rank)
        )
        self._count(number, "Join", "down", reply)
        logger.info(
            "rank %d joined as %s from %s", request.rank, info.participant_id, shown(request.host or "?")
        )
        return reply

    def Subscribe(
        self, request: fedsv_pb2.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[fedsv_pb2.ServerEvent]:
        self._count(self.state.current_round_number(), "Subscribe", "up", request)
        try:
            peer = peer_identity(context.auth_context())
            info = self.state.authenticate(request.participant_id, request.session_token, peer)
            self.state.open_call(info, "Subscribe")
        except Rejected as exc:
            self._refuse(context, exc.reason, str(exc))
        sent_round = 0
        wake = self.state.listen(info.participant_id)
        try:
            while context.is_active():
                task, finished, completed = self.state.next_for(info.participant_id, sent_round, wake)
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
            self.state.unlisten(info.participant_id, wake)
            self.state.close_call(info, "Subscribe")

    def SubmitUpdate(
        self, request_iterator: Iterator[fedsv_pb2.UpdateMessage], context: grpc.ServicerContext
    ) -> fedsv_pb2.SubmitReply:
        number = self.state.current_round_number()
        peer = peer_identity(context.auth_context())
        if peer is not None:
            # Mutual TLS: the certificate names the caller before it sends anything, so its
            # per-participant stream limit applies now; a stream that never sends its header holds
            # one of that identity's slots, never the capacity honest participants need.
            try:
                self.state.open_stream(peer, "SubmitUpdate")
            except Rejected as exc:
                self._refuse(context, exc.reason, str(exc))
        try:
            return self._submit(number, peer, request_iterator, context)
        finally:
            if peer is not None:
                self.state.close_stream(peer, "SubmitUpdate")

    def _submit(
        self,
        number: int,
        peer: str | None,
        request_iterator: Iterator[fedsv_pb2.UpdateMessage],
        context: grpc.ServicerContext,
    ) -> fedsv_pb2.SubmitReply:
        """Read the header, authenticate it (and count the call, when TLS did not name the caller),
        then the update."""
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "header":
            self._refuse(context, "bad_header", "an update must start with a header")
        header = first.header
        # Counted under the open round, never under the round an unauthenticated header claims (an
        # attacker's round numbers would otherwise create traffic rows that are never collected).
        self._count(number, "SubmitUpdate", "up", first)
        try:
            info = self.state.authenticate(header.participant_id, header.session_token, peer)
            if peer is None:  # no certificate named the caller: its limit applies from its header
                self.state.open_call(info, "SubmitUpdate")
            try:
                self._receive_update(info, header, request_iterator)
            finally:
                if peer is None:
                    self.state.close_call(info, "SubmitUpdate")
        except (Rejected, WireError) as exc:
            self._refuse(context, exc.reason, str(exc))
        reply = fedsv_pb2.SubmitReply(
            accepted=True, round=header.round, bytes_received=header.delta.total_bytes
        )
        self._count(number, "SubmitUpdate", "down", reply)
        return reply
