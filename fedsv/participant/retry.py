"""When a rank tries again: the gRPC codes worth retrying, jittered exponential backoff, stop-aware sleeps."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import grpc

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
# An update refused for these is sent again, with backoff, while its round is open. The coordinator
# never refuses with INTERNAL (tests/unit/test_status_codes.py): INTERNAL is gRPC core's own transport
# fault, as when a stream refused for capacity is reset while its upload is still being written.
RESUBMIT = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL}
# A Join refused for who we are (credential, token, certificate) will be refused again: give up.
JOIN_REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}

STOP_POLL_SECONDS = 0.25  # how soon a sleeping rank notices the process's stop event


class JoinRefused(Exception):
    """The coordinator refused who we are at Join: trying again cannot help."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"{code.name} {details or ''}".strip())
        self.code = code


class Backoff:
    """Exponential backoff with jitter (each delay uniform in [d/2, d]); seeded per rank, so that the
    ranks of a burst spread out instead of retrying in step."""

    def __init__(self, first: float = 0.2, cap: float = 5.0, seed: int = 0) -> None:
        self.first, self.cap, self.delay = first, cap, first
        self._random = random.Random(seed)

    def next(self) -> float:
        delay = self.delay * (0.5 + self._random.random() / 2)
        self.delay = min(self.cap, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = self.first


async def sleep_unless_stopped(stop: threading.Event, seconds: float) -> bool:
    """Sleep `seconds` on the event loop, waking early when `stop` is set; True when it was set."""
    end = time.monotonic() + seconds
    while not stop.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(left, STOP_POLL_SECONDS))
    return True
