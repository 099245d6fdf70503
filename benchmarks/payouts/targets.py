"""A payout property's target beside the figure a part measured, and the suite's summary table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fixtures import print_table


@dataclass(frozen=True)
class Target:
    """One target of a part: what it asks, what the part measured, and whether that meets it."""

    part: str
    target: str
    figure: str
    met: bool


def print_summary(targets: Sequence[Target]) -> None:
    """The suite's last table: every target beside its figure."""
    rows = [[t.part, t.target, t.figure, "yes" if t.met else "**no**"] for t in targets]
    print_table(["part", "target", "measured", "met"], rows)
