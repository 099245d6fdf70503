"""The checks settings share: one-line errors that name the setting, and ranges for ports and numbers."""

from __future__ import annotations

import math
import os
from enum import Enum
from pathlib import Path


def require(ok: bool, name: str, rule: str, value: object) -> None:
    """ValueError "NAME must be RULE, got VALUE" (one line naming the setting) unless `ok`."""
    if not ok:
        shown = value.value if isinstance(value, Enum) else value  # a choice as the user wrote it
        raise ValueError(f"{name} must be {rule}, got {shown!r}")


def check_port(name: str, value: int, off: bool = False) -> None:
    """A TCP port 0..65535 (0: ephemeral), or -1 (off) where `off` is allowed."""
    low = -1 if off else 0
    require(low <= value <= 65535, name, f"a port in {low}..65535", value)


def check_positive(name: str, value: float) -> None:
    require(math.isfinite(value) and value > 0, name, "a positive finite number", value)


INT32_MAX = 2**31 - 1
"""The largest count the wire's int32 fields carry (world size, rounds, epochs, batch size, ...)."""

INT64_MAX = 2**63 - 1
"""The largest count an int64 field (or SQLite's INTEGER) carries."""

MAX_SEED = 2**32 - 1
"""The largest seed: each rank's training seed (seed x 1,000,003 + ...) stays within int64 on the wire."""

MAX_SECONDS = 10**8
"""The longest timeout (about three years): deadlines stay within int64 milliseconds on the wire and
within what the threads' waits accept."""


def check_count(name: str, value: int, low: int = 1, high: int = INT32_MAX) -> None:
    """A whole number in low..high (by default what an int32 field of the wire carries)."""
    require(isinstance(value, int) and low <= value <= high, name, f"a whole number in {low}..{high}", value)


def check_seconds(name: str, value: float, low: float = 0.0, *, zero: bool = False) -> None:
    """A finite number of seconds above `low` (or equal to it with `zero`) and at most MAX_SECONDS."""
    above = value >= low if zero else value > low
    rule = f"{'at least' if zero else 'more than'} {low:g} and at most {MAX_SECONDS:g} seconds"
    require(math.isfinite(value) and above and value <= MAX_SECONDS, name, rule, value)


def check_address(name: str, value: str) -> None:
    """HOST:PORT with a host name, an IPv4 address or a [bracketed] IPv6 address, and a port in
    1..65535: what a participant dials."""
    host, sep, port = value.strip().rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:")
    ok_host = bool(bare) and set(bare) <= allowed and (":" not in bare or host.startswith("["))
    ok_port = port.isdigit() and 1 <= int(port) <= 65535
    require(bool(sep) and ok_host and ok_port, name, "HOST:PORT with a port in 1..65535", value)


def check_writable_file(name: str, value: str) -> None:
    """A file the program will write: not a directory, in an existing directory it may write to."""
    path = Path(value)
    parent = path.parent if str(path.parent) else Path(".")
    require(not path.is_dir(), name, "a file, not a directory", value)
    require(parent.is_dir(), name, "a file in an existing directory", value)
    require(os.access(parent, os.W_OK), name, "a file in a directory this process may write to", value)
