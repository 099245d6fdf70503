"""grpc.aio server interceptor: requests whose bytes do not parse get INVALID_ARGUMENT, not INTERNAL."""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from fedsv.coordinator.behaviors import Behavior, before
from fedsv.coordinator.calls import refuse
from fedsv.coordinator.refusals import Refusal
from fedsv.pipeline.metrics import RunMetrics
from fedsv.security.log_safety import RateLimitedLog

logger = logging.getLogger(__name__)


class Malformed:
    """Stands in for a request that is not a valid protobuf message of the method's request type."""

    def __init__(self, error: str) -> None:
        self.error = error


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, a string field that is not UTF-8, ...
            return Malformed(f"{type(exc).__name__}: {exc}")

    return deserialize


class MalformedRequests(grpc.aio.ServerInterceptor):
    """Answer undecodable requests with INVALID_ARGUMENT and count them (reason "malformed").

    Left to gRPC, a request that fails to deserialize ends the call with INTERNAL, which reads as a
    server fault (and participants retry INTERNAL). Here the method's deserializer never raises: a
    bad message becomes a Malformed marker that is refused before the servicer sees it; in a client
    stream, where it stands (the messages before it are handled as usual, and none is read before
    the servicer asks for it).
    """

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics
        self._log = RateLimitedLog(logger)

    async def _refuse(self, context: grpc.aio.ServicerContext, request: Malformed) -> NoReturn:
        await refuse(
            context,
            self.metrics,
            self._log,
            Refusal.MALFORMED,
            f"not a valid protobuf message: {request.error}",
        )

    async def _checked(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Malformed):
                await self._refuse(context, request)
            yield request

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        kind = ("stream" if handler.request_streaming else "unary") + "_"
        kind += "stream" if handler.response_streaming else "unary"
        behavior = getattr(handler, kind)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return handler  # a synchronous handler has no place on this server: left as it is
        # RpcMethodHandler is a namedtuple: swap the deserializer and the behavior, keep the rest.
        return handler._replace(
            request_deserializer=_tolerant(handler.request_deserializer),
            **{kind: self._wrap(behavior, handler.request_streaming)},
        )

    def _wrap(self, behavior: Behavior, request_streaming: bool) -> Behavior:
        """`behavior` behind the Malformed check, of the same kind (gRPC calls each kind its own way:
        a coroutine function is awaited, an async generator function iterated)."""

        async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request_streaming:
                return self._checked(request, context)
            if isinstance(request, Malformed):
                await self._refuse(context, request)
            return request

        return before(behavior, checked, inspect.isasyncgenfunction(behavior))
