"""The thin asyncio gRPC servicer: authenticate, count, hand off to RunState and the two stream modules."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc

from fedsv.coordinator.calls import Calls
from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.sessions import Rejected
from fedsv.coordinator.task_stream import RoundEncodings, task_events
from fedsv.coordinator.update_stream import UpdateLimits, UpdateReceiver
from fedsv.pipeline.metrics import RunMetrics
from fedsv.security.log_safety import RateLimitedLog, shown
from fedsv.security.tls import peer_identity
from fedsv.wire.codec import TensorSpecs
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc

logger = logging.getLogger(__name__)


class CoordinatorServicer(fedsv_pb2_grpc.CoordinatorServicer):
    """Join, Subscribe and SubmitUpdate over a RunState, on grpc.aio; every byte in and out is counted.

    Every handler runs on the server's event loop: RunState's methods it calls only take its lock
    for a moment, and nothing here waits on a thread.
    """

    def __init__(
        self,
        state: RunState,
        run_spec: Callable[[int], fedsv_pb2.RunSpec],
        model_spec: TensorSpecs,
        metrics: RunMetrics,
        limits: UpdateLimits,
    ) -> None:
        self.state = state
        self.run_spec = run_spec
        self.calls = Calls(state, metrics)
        # Joins are logged as refusals are: a start logs each rank's once, a flood of Joins a summary.
        self._joins = RateLimitedLog(logger, burst=state.sessions.world_size + 10)
        self.updates = UpdateReceiver(self.calls, model_spec, limits)
        self.encodings = RoundEncodings(limits.max_chunk_bytes)

    async def Join(
        self, request: fedsv_pb2.JoinRequest, context: grpc.aio.ServicerContext
    ) -> fedsv_pb2.JoinReply:
        number = self.state.board.current_round_number()
        self.calls.count(number, "Join", "up", request)
        try:
            info = self.state.sessions.join(
                request.rank,
                request.world_size,
                request.credential,
                request.host,
                request.participant_token,
                peer_identity(context.auth_context()),
                num_samples=request.num_samples,
            )
        except Rejected as exc:
            await self.calls.refuse(context, exc.reason, str(exc))
        self.state.board.wake([info.participant_id])  # a stream of the session it replaced ends
        reply = fedsv_pb2.JoinReply(
            participant_id=info.participant_id, session_token=info.token, run=self.run_spec(info.rank)
        )
        self.calls.count(number, "Join", "down", reply)
        self._joins.log(
            logging.INFO,
            "joined",
            "rank %d joined as %s from %s",
            request.rank,
            info.participant_id,
            shown(request.host or "?"),
        )
        return reply

    async def Subscribe(
        self, request: fedsv_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[fedsv_pb2.ServerEvent]:
        self.calls.count(self.state.board.current_round_number(), "Subscribe", "up", request)
        try:
            peer = peer_identity(context.auth_context())
            info = self.state.sessions.authenticate(request.participant_id, request.session_token, peer)
            self.state.sessions.open_call(info, "Subscribe")
        except Rejected as exc:
            await self.calls.refuse(context, exc.reason, str(exc))
        events = task_events(self.calls, self.encodings, info.participant_id, info.token)
        try:
            async for event in events:
                yield event
        finally:  # the run ended, or the client went away (the call, and this generator, cancelled)
            await events.aclose()
            self.state.sessions.close_call(info, "Subscribe")

    async def SubmitUpdate(
        self, request_iterator: AsyncIterator[fedsv_pb2.UpdateMessage], context: grpc.aio.ServicerContext
    ) -> fedsv_pb2.SubmitReply:
        return await self.updates.submit(request_iterator, context)
