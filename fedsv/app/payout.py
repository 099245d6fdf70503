"""`fedsv payout`: a budget split by the participants' values, with a rule for negative values and the
range each share spans over the values' 95% intervals (of each value against the others': report.json's
stderr_between)."""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedsv.app.report import RECOMMENDED, build_report, ranked_rows
from fedsv.valuation.accounting.verdict import Z95

VALUES = ("fedsv_shrunk", "fedsv_completed", "fedsv", "fedsv_normalized", "loo")
"""The values a budget can be split by; the first (report.RECOMMENDED) is the default."""
NEGATIVE = ("zero", "shift")
"""How a negative value is paid: `zero`, nothing (the others share the budget by their positive
values); `shift`, every value less the lowest, so the lowest gets nothing and all keep their gaps."""
FALLBACK = "fedsv"
"""What a payout by the recommended value splits by where that pays nobody though the model improved:
FedSV's round values add up to the rounds' gains, so some member holds a positive total."""
FORFEIT = "identical_update"
"""A member the guard turned away for sending the very update another member sent (fedsv.fl.
identical_updates: no member's own training does; a colluding group's crafted vector) is paid nothing
for the run, whatever its values: the coordinator's own evidence that it colluded."""
RULES = ("value", "groups")
"""`value`: each member by its own value; `groups`: members the verdict cannot tell apart (one group of
report.ranked_rows) are paid alike, by their group's mean value."""


@dataclass(frozen=True)
class Share:
    """A participant's part of the budget: its value (and standard error, None: unknown), its share, the
    amount, and the amounts at the two ends of its 95% interval (None where an error is unknown). A
    member never selected is not `valued`: its value, share and amounts are None, and its equal part
    of the budget is held out of the split (held_out)."""

    participant: str
    value: float | None
    stderr: float | None
    group: int | None
    share: float | None
    amount: float | None
    amount_low: float | None
    amount_high: float | None
    valued: bool = True
    paid_by: str = ""  # the value the split went by (FALLBACK where the one asked for paid nobody)
    forfeited: int = 0  # rounds it sent the very update another member sent: paid nothing (FORFEIT)


def _weights(values: list[float], negative: str) -> list[float]:
    if negative == "zero":
        return [max(v, 0.0) for v in values]
    lowest = min(values)
    return [v - lowest for v in values]


def _split(values: list[float], negative: str) -> list[float]:
    weights = _weights(values, negative)
    total = sum(weights)
    if not total > 0:
        raise ValueError(f"no participant has a value to pay by under --negative {negative}")
    return [w / total for w in weights]


def shares(
    values: list[float], errors: list[float | None], amount: float, negative: str
) -> list[tuple[float, ...]]:
    """(share, amount, low, high) per participant: low and high move its own value to the end of its 95%
    interval that hurts (or helps) it and everyone else's to the other end. A value whose error is
    unknown stays where it is in the others' ranges, and its own range is unknown (NaN)."""
    split = _split(values, negative)
    width = [Z95 * e if e is not None and math.isfinite(e) else math.nan for e in errors]
    out: list[tuple[float, ...]] = []
    for i, share in enumerate(split):
        if math.isnan(width[i]):
            out.append((share, share * amount, math.nan, math.nan))
            continue
        move = [0.0 if math.isnan(w) else w for w in width]
        low = [v + w if j != i else v - w for j, (v, w) in enumerate(zip(values, move, strict=True))]
        high = [v - w if j != i else v + w for j, (v, w) in enumerate(zip(values, move, strict=True))]
        low_share, high_share = _split_or_zero(low, negative)[i], _split_or_zero(high, negative)[i]
        out.append((share, share * amount, low_share * amount, high_share * amount))
    return out


def _split_or_zero(values: list[float], negative: str) -> list[float]:
    try:
        return _split(values, negative)
    except ValueError:
        return [0.0] * len(values)


def payout(
    run_dir: str | Path,
    amount: float,
    value: str = RECOMMENDED,
    negative: str = "zero",
    rule: str = "value",
) -> list[Share]:
    """Each participant's part of `amount` by its `value` total (every member of the run, 0 for one that
    contributed nothing); ValueError when the run is not fully valued, a setting is unknown or nothing
    is left to pay by. `rule` "groups" pays members that cannot be told apart alike. A member never
    selected has no value: the valued members split amount x (valued / members), and its equal part
    is held out (held_out). Where the recommended value pays nobody though the model improved, the
    split goes by FALLBACK (each Share's `paid_by` says which value it went by)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {list(RULES)}, got {rule!r}")
    if value not in VALUES:
        raise ValueError(f"value must be one of {list(VALUES)}, got {value!r}")
    if negative not in NEGATIVE:
        raise ValueError(f"negative must be one of {list(NEGATIVE)}, got {negative!r}")
    if not (math.isfinite(amount) and amount > 0):
        raise ValueError(f"amount must be a positive number, got {amount!r}")
    return payout_of(build_report(run_dir), amount, value, negative, rule)


def payout_of(
    report: dict[str, Any],
    amount: float,
    value: str = RECOMMENDED,
    negative: str = "zero",
    rule: str = "value",
) -> list[Share]:
    """payout() of a run's report (report.build_report), its settings checked already."""
    _require_valued(report)
    ranked = ranked_rows(report)
    valued = [row for row in ranked if row.get("valued", True)]
    if not valued:
        raise ValueError("no participant was selected in any round: nothing to pay by")
    pot = amount * len(valued) / len(ranked)
    rows = [row for row in valued if not row.get("rounds_identical")]  # the forfeited are paid nothing
    if not rows:
        raise ValueError("every valued member sent another member's very update: nothing to pay by")
    values = _split_values(rows, value, rule)
    if value == RECOMMENDED and not sum(_weights(values, negative)) > 0 and improved(report):
        value = FALLBACK  # the recommended value pays nobody though the model improved
        values = _split_values(rows, value, rule)
    error_key = f"{value}_stderr"
    errors = [row.get(error_key) for row in rows]
    # a share moves with a member's value against the others': what moves every member alike (another
    # initial model, a round's level) does not move the shares, so the ranges leave it out
    between = [row.get(f"{error_key}_between", row.get(error_key)) for row in rows]
    out = []
    for row, error, (share, paid, low, high) in zip(
        rows, errors, shares(values, between, pot, negative), strict=True
    ):
        out.append(
            Share(
                row["participant"],
                float(row[value] or 0.0),
                error,
                row["group"],
                share,
                paid,
                _none(low),
                _none(high),
                paid_by=value,
            )
        )
    for row in valued:
        if row.get("rounds_identical"):
            value_of = float(row[value] or 0.0)
            out.append(
                Share(
                    row["participant"], value_of, row.get(error_key), row["group"], 0.0, 0.0, 0.0, 0.0,
                    paid_by=value, forfeited=int(row["rounds_identical"]),
                )
            )  # fmt: skip
    missing = [row["participant"] for row in ranked if not row.get("valued", True)]
    out.extend(Share(pid, None, None, None, None, None, None, None, False) for pid in missing)
    return out


def held_out(rows: list[Share], amount: float) -> float:
    """The part of `amount` held out of the split for the members not valued (each its equal part)."""
    return amount * sum(not row.valued for row in rows) / max(len(rows), 1)


def _split_values(rows: list[dict[str, Any]], value: str, rule: str) -> list[float]:
    """What each valued row is paid by: its `value` total, or under rule "groups" its group's mean."""
    values = [float(row[value] or 0.0) for row in rows]
    if rule != "groups":
        return values
    owners = [row.get("owner") or [row["participant"]] for row in rows]
    return _group_means(values, [row["group"] for row in rows], owners)


def improved(report: dict[str, Any]) -> bool:
    """Whether the run's model ended better on the validation set than it started."""
    scored = [
        e
        for e in report["rounds"]
        if e.get("utility_before") is not None and e.get("utility_after") is not None
    ]
    return bool(scored) and scored[-1]["utility_after"] > scored[0]["utility_before"]


def _group_means(values: list[float], groups: list[int | None], owners: list[list[str]]) -> list[float]:
    """Each value replaced by its group's mean over owners (a member without a group keeps its own): an
    owner of several participants (`owners`: each row's owner's participants) counts once, with its
    participants' values summed, and each of them gets its equal part of the mean."""
    members: dict[int, dict[tuple[str, ...], float]] = {}
    for v, g, owner in zip(values, groups, owners, strict=True):
        if g is not None:
            held = members.setdefault(g, {})
            held[tuple(owner)] = held.get(tuple(owner), 0.0) + v
    means = {g: sum(held.values()) / len(held) for g, held in members.items()}
    return [
        v if g is None else means[g] / len(owner) for v, g, owner in zip(values, groups, owners, strict=True)
    ]


def _none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _require_valued(report: dict[str, Any]) -> None:
    """A run is paid only once every round it was to train is committed with its values."""
    entries = report["rounds"]
    pending = [e["round"] for e in entries if e["status"] == "pending"]
    planned = report["config"].get("rounds")
    if pending:
        raise ValueError(f"the run is not fully valued yet: rounds {pending} await their values")
    if isinstance(planned, int) and len(entries) < planned:
        raise ValueError(
            f"the run is not fully valued yet: {len(entries)} of its {planned} rounds are recorded"
        )


def write_csv(path: Path, rows: list[Share]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(Share.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)


def format_payout(rows: list[Share], amount: float, value: str, negative: str, rule: str = "value") -> str:
    by = "members that cannot be told apart paid alike" if rule == "groups" else "each by its own value"
    used = next((row.paid_by for row in rows if row.valued and row.paid_by), value)
    note = (
        [
            f"{value} pays nobody (no value above 0) though the model improved: paid by {used}, whose "
            "round values add up to the rounds' gains",
        ]
        if used != value
        else []
    )
    value = used
    lines = [
        *note,
        f"payout of {amount:,.2f} by {value}, {by} (negative values: {negative}); "
        "range: the 95% intervals' ends (errors against the other members' values)",
        "",
        f"{'participant':<12} {'value ± stderr':>20} {'group':>5} {'share':>8} {'amount':>12} {'range':>27}",
    ]
    for row in rows:
        if not row.valued:
            lines.append(f"{row.participant:<12} {'not valued (never selected)':>36} {'held out':>21}")
            continue
        error = "?" if row.stderr is None or not math.isfinite(row.stderr) else f"{row.stderr:.5f}"
        span = (
            "?"
            if row.amount_low is None or row.amount_high is None
            else f"{row.amount_low:,.2f} - {row.amount_high:,.2f}"
        )
        value = f"{row.value or 0.0:.5f} ± {error}"
        group = "-" if row.group is None else str(row.group)
        lines.append(
            f"{row.participant:<12} {value:>20} {group:>5} {row.share or 0.0:>8.2%} "
            f"{row.amount or 0.0:>12,.2f} {span:>27}"
        )
    for row in rows:
        if row.forfeited:
            lines.append(
                f"\n{row.participant} is paid nothing: in {row.forfeited} round(s) it sent the very update "
                "another member sent, which no member's own training does (a colluding group's vector)"
            )
    missing = [row.participant for row in rows if not row.valued]
    if missing:
        lines.append(
            f"\nheld out of the split: {held_out(rows, amount):,.2f} ({len(missing)} of {len(rows)} equal "
            f"parts) for {', '.join(missing)}, never selected and so not valued: pay it when they are "
            "valued (a later run), or split it as the consortium decides"
        )
    return "\n".join(lines)
