"""A payout property's target beside the figure a part measured, and the suite's summary table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One target of a part: what it asks, what the part measured, and whether that meets it."""

    part: str
    target: str
    figure: str
    met: bool


def summary(targets: Sequence[Target]) -> str:
    """The suite's last table: every target beside its figure."""
    lines = ["| part | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {t.part} | {t.target} | {t.figure} | {'yes' if t.met else '**no**'} |" for t in targets]
    return "\n".join(lines)
