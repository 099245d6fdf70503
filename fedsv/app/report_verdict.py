"""The report's verdict: whether the values tell the members apart, in a sentence that follows the amounts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedsv.valuation.accounting.verdict import Verdict, owners_verdict

ALIKE = 1.5
"""Amounts count as alike where the highest member's is at most this many times the lowest's."""


def paid_shares(values: Mapping[str, float | None]) -> dict[str, float]:
    """Each valued member's share of a payout by `values` (negative values paid nothing; none where
    nothing is positive)."""
    paid = {pid: max(v, 0.0) for pid, v in values.items() if v is not None and math.isfinite(v)}
    total = sum(paid.values())
    return {pid: v / total for pid, v in paid.items()} if total > 0 else {}


def verdict_line(result: Verdict, shares: Mapping[str, float], recommended: str) -> str:
    """The verdict's line; where it finds no difference but the `recommended` value's payout `shares`
    are not alike among the members it tested, the line says what they are paid instead of "pay them
    alike", and how to pay them alike."""
    line = result.line()
    if math.isnan(result.p_value) or result.distinguishes or not result.groups:
        return line
    tested = [shares[pid] for pid in result.groups[0] if pid in shares]
    if not tested or max(tested) <= ALIKE * min(tested):
        return line
    return line.replace(
        "; pay them alike",
        f"; yet {recommended} pays them {100 * min(tested):.1f}–{100 * max(tested):.1f}%, each by its own "
        "evidence: `fedsv payout --rule groups` pays them alike",
    )


def verdict_entry(
    values: dict[str, Any],
    errors: dict[str, Any],
    owners: list[list[str]],
    recommended: dict[str, Any],
    value: str,
    recommended_name: str,
) -> dict[str, Any]:
    """The report's verdict on the members' `value` totals (an owner of several participants tested as
    one member), its line following the `recommended` value's amounts."""
    known = {pid: v for pid, v in values.items() if v is not None}
    result = owners_verdict(known, {pid: errors.get(pid) for pid in known}, owners)
    return {
        "value": value,
        "line": verdict_line(result, paid_shares(recommended), recommended_name),
        "p_value": None if math.isnan(result.p_value) else result.p_value,
        "members_tested": result.members,
        "distinguishes": result.distinguishes,
        "groups": result.groups,
    }
