"""Who may have joined twice, in a report: owners valued as one member, and look-alike members valued
apart (their updates far more alike than independent data give, with merging off)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from fedsv.ledger import ValueRow


def round_alike(rows: Sequence[ValueRow]) -> list[list[str]]:
    """A round's look-alike groups from its value rows (each row names the first of its group)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        if row.alike:
            groups.setdefault(row.alike, []).append(row.participant)
    return [group for group in groups.values() if len(group) > 1]


def lookalikes(rounds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pair of members some round found alike (report.json's rounds, each with `values` and
    `alike`): in how many rounds (`rounds`) of those both were valued in (`together`), most first."""
    alike: dict[tuple[str, str], int] = {}
    for entry in rounds:
        for group in entry.get("alike", []):
            for pair in itertools.combinations(sorted(group), 2):
                alike[pair] = alike.get(pair, 0) + 1
    together = {
        pair: sum(1 for entry in rounds if set(pair) <= set(entry.get("values", {}))) for pair in alike
    }
    ordered = sorted(alike, key=lambda pair: (-alike[pair], pair))
    return [{"members": list(pair), "rounds": alike[pair], "together": together[pair]} for pair in ordered]


def owner_lines(report: dict[str, Any]) -> list[str]:
    """One line per owner of several participants (report.json's `owners`) and per look-alike pair
    (`lookalikes`), for the table and the page."""
    owners = [
        f"{' and '.join(owner)}: valued as one owner (their updates were far more alike than independent "
        "data give); tested as one member, their value split equally"
        for owner in report.get("owners", [])
    ]
    alike = [
        f"{' and '.join(pair['members'])} look alike: their updates were far more alike than independent "
        f"data give in {pair['rounds']} of the {pair['together']} rounds both were valued in (a copy of "
        "one's data, or members that drew the same classes); each was valued and paid as its own member "
        "(--valuation-merge-redundant values such members as one owner)"
        for pair in report.get("lookalikes", [])
    ]
    return owners + alike
