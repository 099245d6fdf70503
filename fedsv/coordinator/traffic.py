"""Traffic counting: bytes and messages per round, RPC and direction, taken out when a round commits."""

from __future__ import annotations

import threading
from collections import defaultdict


class TrafficCounter:
    """Every message in and out, counted per round, RPC and direction ("up" = participant -> coordinator)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.traffic: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0])

    def count(self, round_number: int, rpc: str, direction: str, nbytes: int, messages: int = 1) -> None:
        with self._lock:
            cell = self.traffic[(round_number, rpc, direction)]
            cell[0] += nbytes
            cell[1] += messages

    def take(self, round_number: int) -> dict[tuple[str, str], tuple[int, int]]:
        """Traffic counted for a round (and, for round r, anything counted before it under 0)."""
        with self._lock:
            keys = [k for k in self.traffic if k[0] <= round_number]
            out: dict[tuple[str, str], tuple[int, int]] = {}
            for key in keys:
                nbytes, messages = self.traffic.pop(key)
                prev = out.get((key[1], key[2]), (0, 0))
                out[(key[1], key[2])] = (prev[0] + nbytes, prev[1] + messages)
            return out
