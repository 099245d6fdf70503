"""The checks settings share: one-line errors that name the setting, and ranges for ports and numbers."""

from __future__ import annotations

import math


def require(ok: bool, name: str, rule: str, value: object) -> None:
    """ValueError "NAME must be RULE, got VALUE" (one line naming the setting) unless `ok`."""
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def check_port(name: str, value: int, off: bool = False) -> None:
    """A TCP port 0..65535 (0: ephemeral), or -1 (off) where `off` is allowed."""
    low = -1 if off else 0
    require(low <= value <= 65535, name, f"a port in {low}..65535", value)


def check_positive(name: str, value: float) -> None:
    require(math.isfinite(value) and value > 0, name, "a positive finite number", value)
