"""The ranges several settings share, as `Annotated` aliases: a setting's declaration narrows one."""

from __future__ import annotations

from typing import Annotated, TypeAlias

from pydantic import Field

from fedsv.config.checks import INT32_MAX, INT64_MAX, MAX_SECONDS

Seconds: TypeAlias = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A timeout: more than 0 seconds, finite, at most MAX_SECONDS."""

Grace: TypeAlias = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A wait that may be none: 0 seconds or more, finite, at most MAX_SECONDS."""

Count: TypeAlias = Annotated[int, Field(ge=1, le=INT32_MAX)]
"""A count the wire's int32 fields carry: at least 1."""

Bytes: TypeAlias = Annotated[int, Field(ge=1, le=INT64_MAX)]
"""A size or count in int64: at least 1."""

Threads: TypeAlias = Annotated[int, Field(ge=0, le=4096)]
"""Threads or processes (0 = the process's own choice)."""

Port: TypeAlias = Annotated[int, Field(ge=0, le=65535)]
"""A TCP port (0 = ephemeral)."""

OptionalPort: TypeAlias = Annotated[int, Field(ge=-1, le=65535)]
"""A TCP port, 0 = ephemeral, -1 = off."""

Fraction: TypeAlias = Annotated[float, Field(gt=0, le=1)]
"""A share of the federation: more than 0, at most 1."""

Positive: TypeAlias = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite number above 0."""

NonNegative: TypeAlias = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite number, 0 or above."""
