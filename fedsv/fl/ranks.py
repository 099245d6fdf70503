"""Rank lists and participant ids: parsing "0-4,9", contiguous blocks of ranks, the id of a rank."""

from __future__ import annotations

import re

DIGITS = re.compile(r"[0-9]+")


def participant_id(rank: int) -> str:
    """The stable id of a rank (also its certificate's common name): p000, p001, ..."""
    return f"p{rank:03d}"


def check_world_size(world_size: int, what: str = "world size") -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{what} must be a positive integer, got {world_size!r}")


def parse_ranks(spec: str, world_size: int) -> tuple[int, ...]:
    """Parse a rank list such as "3", "0-24" or "0-4,10,12-13" into sorted unique ranks in 0..world_size-1."""
    check_world_size(world_size)
    if not spec or not spec.strip():
        raise ValueError("empty rank list: expected e.g. 3, 0-24 or 0-4,10,12-13")
    ranks: set[int] = set()
    for raw in spec.split(","):
        part = raw.strip()
        lo_text, dash, hi_text = part.partition("-")
        lo_text, hi_text = lo_text.strip(), hi_text.strip()
        if not DIGITS.fullmatch(lo_text) or (dash and not DIGITS.fullmatch(hi_text)):
            raise ValueError(
                f"bad rank range {part!r} in {spec!r}: expected N or A-B with non-negative integers"
            )
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if hi < lo:
            raise ValueError(f"bad rank range {part!r} in {spec!r}: start {lo} is after end {hi}")
        if hi >= world_size:
            raise ValueError(
                f"rank {hi} in {spec!r} is out of range for world size {world_size} (0..{world_size - 1})"
            )
        ranks.update(range(lo, hi + 1))
    return tuple(sorted(ranks))


def block_of(process_index: int, processes: int, world_size: int) -> tuple[int, ...]:
    """Ranks of `process_index` when 0..world_size-1 is cut into `processes` contiguous near-equal blocks.

    The first world_size % processes blocks hold one rank more than the others.
    """
    check_world_size(processes, "process count")
    check_world_size(world_size)
    if not 0 <= process_index < processes:
        raise ValueError(f"process index {process_index} is out of range for {processes} processes")
    if world_size < processes:
        raise ValueError(
            f"{processes} processes for only {world_size} ranks: some processes would have no rank"
        )
    base, extra = divmod(world_size, processes)
    start = process_index * base + min(process_index, extra)
    size = base + (1 if process_index < extra else 0)
    return tuple(range(start, start + size))
