"""grpc.aio server interceptor: a unary request must arrive within a deadline, or the call ends."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fedsv.coordinator.behaviors import before
from fedsv.coordinator.calls import refuse
from fedsv.coordinator.refusals import Refusal
from fedsv.pipeline.metrics import RunMetrics
from fedsv.security.log_safety import RateLimitedLog

logger = logging.getLogger(__name__)


class FirstMessageDeadline(grpc.aio.ServerInterceptor):
    """End a unary-request call (Join, Subscribe, health checks) whose request has not arrived within
    `timeout` seconds with DEADLINE_EXCEEDED (reason "request_timeout").

    gRPC reads a unary request before it calls the handler and bounds that read by nothing but the
    client's own deadline, so a client that opens calls and never sends their requests holds them
    open for good. Here such a handler is served as a client-streaming one (the same call on the wire:
    HTTP/2 does not tell them apart) that reads its one request under a timeout, as SubmitUpdate reads
    its header.
    """

    def __init__(self, metrics: RunMetrics, timeout: float) -> None:
        self.metrics = metrics
        self.timeout = timeout
        self.awaiting = 0  # calls waiting for their request now (touched on the event loop only)
        self._log = RateLimitedLog(logger)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.response_streaming:
            behavior = handler.unary_stream
            if not inspect.isasyncgenfunction(behavior):
                return handler  # a synchronous handler has no place on this server: left as it is
            return grpc.stream_stream_rpc_method_handler(
                before(behavior, self._first, True), handler.request_deserializer, handler.response_serializer
            )
        behavior = handler.unary_unary
        if not inspect.iscoroutinefunction(behavior):
            return handler
        return grpc.stream_unary_rpc_method_handler(
            before(behavior, self._first, False), handler.request_deserializer, handler.response_serializer
        )

    async def _first(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        """The call's one request, read within the timeout; the call refused otherwise."""
        self.awaiting += 1
        self.metrics.awaiting_request.set(self.awaiting)
        try:
            return await asyncio.wait_for(anext(requests), self.timeout)
        except TimeoutError:
            message = f"no request within {self.timeout:g} s"
        except StopAsyncIteration:
            message = "the call ended without a request"
        finally:
            self.awaiting -= 1
            self.metrics.awaiting_request.set(self.awaiting)
        await refuse(context, self.metrics, self._log, Refusal.REQUEST_TIMEOUT, message)
