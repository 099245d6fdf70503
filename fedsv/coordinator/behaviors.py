"""Wrapping a grpc.aio handler's behaviour so that something runs on its request first (interceptors)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]
Prepare = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def before(behavior: Behavior, prepare: Prepare, streaming: bool) -> Behavior:
    """`behavior` called on what `prepare` makes of its request, of the same kind as it: an async
    generator function when `streaming` (gRPC iterates it), else a coroutine function (awaited)."""
    if streaming:

        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            responses = behavior(await prepare(request, context), context)
            try:
                async for response in responses:
                    yield response
            finally:
                await responses.aclose()

        return streamed

    async def awaited(request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(await prepare(request, context), context)

    return awaited
