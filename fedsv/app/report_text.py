"""The run's report as text: participants ranked with their values and errors, and values per label."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fedsv.app.report import ranked_rows
from fedsv.app.report_owners import owner_lines
from fedsv.app.run_dirs import RunDir


def _name_width(rows: list[dict[str, Any]]) -> int:
    """The participant column's width: its longest name (Flower's node ids run to 25 characters)."""
    return max([12, *(len(row["participant"]) for row in rows)])


def format_runs(runs: list[RunDir], chosen: Path) -> str:
    """A folder's runs, oldest first, the reported one marked."""
    count = f"{len(runs)} runs" if len(runs) != 1 else "1 run"
    lines = [f"{count} in {chosen.parent} (oldest first); reporting the one marked *:"]
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at))
        mark = "*" if run.path == chosen else " "
        run_id = "" if run.run_id == run.path.name else f"  (run {run.run_id})"
        rounds = f"{run.rounds} round{'s' if run.rounds != 1 else ''}"
        lines.append(f" {mark} {run.path.name:<30} {started}  {rounds:<10}{run_id}")
    return "\n".join(lines)


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def _plus_minus(value: float | None, error: float | None, digits: int) -> str:
    """ "0.12345 ± 0.00012"; "± ?" where the error is unknown; "?" where the value is not known yet."""
    if value is None:
        return "?"
    if error is None:
        return f"{value:.{digits}f} ± ?"
    return f"{value:.{digits}f} ± {0 if error == 0 else f'{error:.{digits}f}':<{digits + 2}}"


def _not_valued(report: dict[str, Any]) -> list[str]:
    """The members no round selected: they have no value (not a value of 0), and a payout holds their
    equal parts of the budget out of the split."""
    missing = report.get("not_valued", [])
    if not missing:
        return []
    return [
        f"NOT VALUED: {', '.join(missing)} (never selected: no value, not a value of 0; "
        f"`fedsv payout` holds {'its' if len(missing) == 1 else 'their'} equal part of the budget out "
        "of the split)"
    ]


def _awaiting(report: dict[str, Any]) -> list[str]:
    """What the table cannot show as known: the rounds still awaiting their values."""
    pending = report.get("pending_rounds", [])
    if not pending:
        return []
    valued = report["summary"]["rounds"] - len(pending)
    return [
        f"PARTIAL: rounds {', '.join(map(str, pending))} await their values ({valued} of "
        f"{report['summary']['rounds']} rounds valued); a member selected in them shows a partial total "
        "with an unknown error (± ?), and no completed value is final",
    ]


def format_table(report: dict[str, Any]) -> str:
    """Every participant ranked by the recommended value, each value beside its standard error against a
    rerun (the recommended shrunk value first), under a header of accuracy and traffic and the verdict;
    "~" marks a rank not separated from the next at 95%, the group column the members the values
    cannot tell apart."""
    summary = report["summary"]
    accuracy = report["final_accuracy"]
    ranked = ranked_rows(report)
    width = _name_width(ranked)
    ratio = summary["bytes_ratio_to_minimum"]
    up, down = _bytes(summary["bytes_up_per_round"]), _bytes(summary["bytes_down_per_round"])
    rounds = summary["rounds"]
    verdict = report.get("verdict", {}).get("line")
    lines = [
        f"run {report['run_id']}: {rounds} round{'s' if rounds != 1 else ''}, "
        + ("no test set (no test accuracy)" if accuracy is None else f"final test accuracy {accuracy:.4f}"),
        f"traffic: {_bytes(summary['bytes_per_round'])} per round (up {up}, down {down}); "
        + ("-" if ratio is None else f"{ratio:.3f}x")
        + f" the physical minimum of {_bytes(summary['physical_minimum_bytes_per_round'])}",
        *_awaiting(report),
        *([] if verdict is None else [f"{verdict} ({report['verdict']['value']}, errors against a rerun)"]),
        *owner_lines(report),
        *_not_valued(report),
        "",
        f"{'rank':>5}  {'participant':<{width}} {'group':>5} {'rounds':>6} {'refused':>7} {'samples':>8} "
        f"{'shrunk ± stderr':>20} {'completed ± stderr':>20} {'fedsv ± stderr':>20} "
        f"{'fedsv_norm ± stderr':>20} {'loo':>9} {'loo_norm':>9}",
    ]
    corrupted = summary.get("corrupted", {})
    for row in ranked:
        mark = f"  (corrupted: {corrupted[row['participant']]})" if row["participant"] in corrupted else ""
        if row.get("rounds_quarantined"):
            mark += f"  (quarantined in {row['rounds_quarantined']} rounds)"
        if row.get("rounds_public"):
            mark += f"  (public in {row['rounds_public']} rounds: nothing beyond the global model's steps)"
        samples = "-" if row["num_samples"] is None else str(row["num_samples"])
        rank = f"{row['rank']:>4}{'~' if row['separated_from_next'] is False else ' '}"
        if row.get("valued") is False:
            lines.append(
                f"{rank}  {row['participant']:<{width}} {'-':>5} {0:>6} {0:>7} {samples:>8} "
                f"{'not valued (never selected)':>20}{mark}"
            )
            continue
        group = "-" if row["group"] is None else str(row["group"])
        loo = "?" if row["loo"] is None else f"{row['loo']:.5f}"
        loo_norm = "?" if row["loo_normalized"] is None else f"{row['loo_normalized']:.4f}"
        lines.append(
            f"{rank}  {row['participant']:<{width}} {group:>5} {row['rounds_selected']:>6} "
            f"{row['rounds_refused']:>7} {samples:>8} "
            f"{_plus_minus(row['fedsv_shrunk'], row['fedsv_shrunk_stderr'], 5):>20} "
            f"{_plus_minus(row['fedsv_completed'], row['fedsv_completed_stderr'], 5):>20} "
            f"{_plus_minus(row['fedsv'], row['fedsv_stderr'], 5):>20} "
            f"{_plus_minus(row['fedsv_normalized'], row['fedsv_normalized_stderr'], 4):>20} "
            f"{loo:>9} {loo_norm:>9}{mark}"
        )
    if any(row["separated_from_next"] is False for row in ranked):
        lines.append("\n~ not separated from the next rank at 95% (difference within 1.96 combined stderr)")
    lines.append(
        "\nerrors: the estimator's, the validation set's and a rerun's (training, selection, initial model) "
        "together; report.json's stderr_parts has each"
    )
    return "\n".join(lines)


def format_classes(report: dict[str, Any]) -> str:
    """Participants (best FedSV first) by validation label: each one's FedSV on that label's samples; the
    labels of a participant add up to its FedSV when every round was valued by label."""
    classes = report["classes"]
    if not classes["labels"]:
        return "no values per label: no round of this run was valued by label"
    labels = range(classes["labels"])
    ranked = ranked_rows(report)
    width = _name_width(ranked)
    lines = [
        f"FedSV per validation label ({classes['rounds_split']} of {classes['rounds']} rounds split)",
        "",
        f"{'participant':<{width}} "
        + " ".join(f"{label:>9}" for label in labels)
        + f" {'sum':>9} {'fedsv':>9}",
    ]
    for row in ranked:
        values = classes["totals"].get(row["participant"])
        if values is None:
            continue
        cells = " ".join(f"{v:>9.5f}" for v in values)
        fedsv = "?" if row["fedsv"] is None else f"{row['fedsv']:.5f}"
        lines.append(f"{row['participant']:<{width}} {cells} {sum(values):>9.5f} {fedsv:>9}")
    return "\n".join(lines)
