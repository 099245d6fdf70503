"""Checks beyond a field's range (one line naming the setting), and the wire's largest numbers."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path


def require(ok: bool, name: str, rule: str, value: object) -> None:
    """ValueError "NAME must be RULE, got VALUE" (one line naming the setting) unless `ok`."""
    if not ok:
        shown = value.value if isinstance(value, Enum) else value  # a choice as the user wrote it
        raise ValueError(f"{name} must be {rule}, got {shown!r}")


INT32_MAX = 2**31 - 1
"""The largest count the wire's int32 fields carry (world size, rounds, epochs, batch size, ...)."""

INT64_MAX = 2**63 - 1
"""The largest count an int64 field (or SQLite's INTEGER) carries."""

MAX_SEED = 2**32 - 1
"""The largest seed: each rank's training seed (seed x 1,000,003 + ...) stays within int64 on the wire."""

MAX_SECONDS = 10**8
"""The longest timeout (about three years): deadlines stay within int64 milliseconds on the wire and
within what the threads' waits accept."""


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
