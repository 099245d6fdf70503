"""Safe logging of what the network sends: strings cut short and escaped, repeated refusals summarised."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

MAX_SHOWN = 200
"""Characters of a network-supplied string that reach a log line or a status message."""


def shown(text: object, limit: int = MAX_SHOWN) -> str:
    """`text` fit for one log line: control and non-printable characters escaped (backslash forms),
    then cut to `limit` characters with a count of what was left out."""
    raw = str(text)
    escaped = raw[: limit * 4].encode("unicode_escape").decode("ascii")
    if len(escaped) <= limit and len(raw) <= limit * 4:
        return escaped
    return f"{escaped[:limit]}...(+{max(0, len(raw) - limit)} chars)"


class RateLimitedLog:
    """At most `burst` lines per key (e.g. a refusal reason) per `window` seconds; the lines held back
    are summed up in one line when the key next logs after its window. Counting every event is the
    metrics' job (fedsv_updates_rejected_total); this only keeps the log readable under attack."""

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = 10,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.burst, self.window, self.clock = logger, burst, window, clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, int, int]] = {}  # key -> (window start, logged, held back)

    def log(self, level: int, key: str, msg: str, *args: object) -> None:
        now = self.clock()
        with self._lock:
            start, logged, held = self._state.get(key, (now, 0, 0))
            if now - start >= self.window:
                if held:
                    self.logger.log(
                        level, "%d more %r lines held back in the last %.0f s", held, key, now - start
                    )
                start, logged, held = now, 0, 0
            if logged < self.burst:
                self._state[key] = (start, logged + 1, held)
                emit = True
            else:
                self._state[key] = (start, logged, held + 1)
                emit = False
        if emit:
            self.logger.log(level, msg, *args)
