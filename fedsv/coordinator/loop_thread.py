"""One asyncio event loop in its own thread, driven from plain threads: where the gRPC servers run."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread from construction until `close()`.

    `run` hands a coroutine to the loop and waits for its result; `call` does the same for a plain
    function that must run on the loop's thread (grpc.aio objects are made and bound there).
    """

    def __init__(self, name: str = "grpc-aio") -> None:
        self.loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            # Stopped: whatever still runs (a stream the server did not end) is cancelled and awaited,
            # so that its `finally` releases what it holds.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the loop; its result (or exception) once it is done."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, function: Callable[[], T], timeout: float | None = None) -> T:
        """Run a plain function on the loop's thread; its result (or exception)."""

        async def on_loop() -> T:
            return function()

        return self.run(on_loop(), timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = 30.0) -> None:
        """Stop the loop (cancelling what still runs on it) and wait for its thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


def threadsafe_setter(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """A function any thread may call to set `event` on `loop` (a no-op once the loop is closed)."""

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits on the event any more
            loop.call_soon_threadsafe(event.set)

    return wake
