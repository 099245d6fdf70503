"""gRPC server interceptor: requests whose bytes do not parse get INVALID_ARGUMENT, not gRPC's INTERNAL."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from fedsv.common.log_safety import RateLimitedLog, shown
from fedsv.coordinator.metrics import CoordinatorMetrics
from fedsv.coordinator.status_codes import status_of

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


class MalformedRequests(grpc.ServerInterceptor):
    """Answer undecodable requests with INVALID_ARGUMENT and count them (reason "malformed").

    Left to gRPC, a request that fails to deserialize ends the call with INTERNAL, which reads as a
    server fault (and participants retry INTERNAL). Here the method's deserializer never raises: a
    bad message becomes a Malformed marker that is refused before the servicer sees it; in a client
    stream, where it stands (the messages before it are handled as usual).
    """

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self._log = RateLimitedLog(logger)

    def _refuse(self, context: grpc.ServicerContext, request: Malformed) -> NoReturn:
        self.metrics.reject("malformed")
        error = shown(request.error)
        self._log.log(logging.INFO, "malformed", "rejected (malformed): %s", error)
        context.abort(status_of("malformed"), f"not a valid protobuf message: {error}")
        raise AssertionError("unreachable")  # context.abort raises

    def _checked(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for request in requests:
            if isinstance(request, Malformed):
                self._refuse(context, request)
            yield request

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        kind = ("stream" if handler.request_streaming else "unary") + "_"
        kind += "stream" if handler.response_streaming else "unary"
        behavior = getattr(handler, kind)

        def checked(request: Any, context: grpc.ServicerContext) -> Any:
            if handler.request_streaming:
                return behavior(self._checked(request, context), context)
            if isinstance(request, Malformed):
                self._refuse(context, request)
            return behavior(request, context)

        # RpcMethodHandler is a namedtuple: swap the deserializer and the behavior, keep the rest.
        return handler._replace(
            request_deserializer=_tolerant(handler.request_deserializer), **{kind: checked}
        )
