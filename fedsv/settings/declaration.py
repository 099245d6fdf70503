"""A setting's declaration: its section, default, range and help (the schema's entries)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fedsv.config.checks import (
    INT32_MAX,
    check_count,
    check_port,
    check_positive,
    check_seconds,
    require,
)


class Section(StrEnum):
    """Where a setting belongs (help groups them so)."""

    DATA = "data"
    TRAINING = "training"
    GUARD = "guard"
    AGGREGATION = "aggregation"
    VALUATION = "valuation"
    SERVER = "server"
    PARTICIPANT = "participant"
    LAUNCH = "launch"


@dataclass(frozen=True)
class Count:
    """A whole number in low..high (by default what an int32 field of the wire carries)."""

    low: int = 1
    high: int = INT32_MAX

    def __call__(self, name: str, value: Any) -> None:
        check_count(name, value, low=self.low, high=self.high)


@dataclass(frozen=True)
class Seconds:
    """Seconds above `low` (or equal to it with `zero`), at most MAX_SECONDS."""

    low: float = 0.0
    zero: bool = False

    def __call__(self, name: str, value: Any) -> None:
        check_seconds(name, value, self.low, zero=self.zero)


@dataclass(frozen=True)
class Port:
    """A TCP port (0: ephemeral), or -1 (off) where `off`."""

    off: bool = False

    def __call__(self, name: str, value: Any) -> None:
        check_port(name, value, off=self.off)


@dataclass(frozen=True)
class Positive:
    """A positive finite number."""

    def __call__(self, name: str, value: Any) -> None:
        check_positive(name, value)


@dataclass(frozen=True)
class NonNegative:
    """0 or a positive finite number."""

    def __call__(self, name: str, value: Any) -> None:
        require(math.isfinite(value) and value >= 0, name, "0 or a positive number", value)


@dataclass(frozen=True)
class Share:
    """A fraction in (0, 1]."""

    def __call__(self, name: str, value: Any) -> None:
        require(0.0 < value <= 1.0, name, "in (0, 1]", value)


Range = Count | Seconds | Port | Positive | NonNegative | Share


@dataclass(frozen=True)
class Setting:
    """One setting: its section, default, range (None: checked where it is used) and help."""

    section: Section
    default: Any
    help: str
    range: Range | None = None
    choices: type[StrEnum] | None = None
    later: bool = False  # added after runs were recorded: at its default (the behaviour before it) it is
    # left out of a run's record and id, so that a run recorded before it resumes
