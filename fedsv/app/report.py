"""`fedsv report`: a run's values, accuracy and traffic from its ledger, as JSON, CSV, a plot and a table."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsv.coordinator.config import RunConfig
from fedsv.fl.ranks import participant_id
from fedsv.ledger import Ledger, RoundRecord, UpdateRow, ValueRow, federated_valuation
from fedsv.valuation.rounds import TOTAL_KEYS

logger = logging.getLogger(__name__)

LEDGER_NAME = "ledger.sqlite"
CSV_COLUMNS = (
    "participant",
    "rounds_selected",
    "num_samples",
    *TOTAL_KEYS,
    "fedsv_stderr",
    "fedsv_normalized_stderr",
    "fedsv_completed_stderr",
    "rank_by_fedsv",
    "separated_from_next",
)
"""values.csv: a participant's totals, the FedSV total's standard errors (empty: unknown), its rank, and
whether its FedSV total is separated from the next rank's at 95%."""

Z95 = 1.959964
"""Two totals are separated at 95% when they differ by more than Z95 x their combined standard error."""


def _num(x: float | None) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    return None if x is None or not math.isfinite(x) else float(x)


def _corrupted(config: dict[str, Any]) -> dict[str, str]:
    """Participant id -> corruption spec of the run's `corrupt` setting; empty if none or not a RunConfig."""
    try:
        ranks = RunConfig(**config).corruptions()
    except (TypeError, ValueError):
        return {}
    return {participant_id(rank): spec for rank, spec in sorted(ranks.items())}


def _world(config: dict[str, Any]) -> list[str] | None:
    """Every participant id of a fedsv run's config (its `participants` count); None for other ledgers."""
    count = config.get("participants")
    return [participant_id(r) for r in range(count)] if isinstance(count, int) and count > 0 else None


def _round_entry(rec: RoundRecord, rows: list[ValueRow], updates: list[UpdateRow]) -> dict[str, Any]:
    return {
        "round": rec.round,
        "selected": rec.selected,
        "received": rec.received,
        "stragglers": rec.stragglers,
        "utility_before": _num(rec.utility_before),
        "utility_after": _num(rec.utility_after),
        "test_accuracy": _num(rec.test_accuracy),
        "test_loss": _num(rec.test_loss),
        "values": {r.participant: r.fedsv for r in rows},
        "stderr": {r.participant: _num(r.fedsv_stderr) for r in rows},
        "max_stderr": _num(rec.max_stderr),
        "status": str(rec.status),
        "loo": {r.participant: r.loo for r in rows},
        "num_samples": {u.participant: u.num_samples for u in updates},
        "method": rec.method,
        "valuation_seconds": rec.valuation_seconds,
        "utility_evaluations": rec.evaluations,
        "round_seconds": rec.round_seconds,
        "bytes_up": rec.bytes_up,
        "bytes_down": rec.bytes_down,
        "messages_up": rec.messages_up,
        "messages_down": rec.messages_down,
        "model_bytes": rec.model_bytes,
        "physical_minimum_bytes": rec.physical_minimum_bytes,
        "bytes_ratio_to_minimum": _num(rec.bytes_ratio_to_minimum),
        "group_rationality_residual": _num(rec.group_rationality_residual),
    }


def _ledger_path(run_dir: str | Path) -> Path:
    directory = Path(run_dir)
    if not directory.is_dir():
        raise ValueError(f"run directory {directory} does not exist")
    path = directory / LEDGER_NAME
    if not path.is_file():
        raise ValueError(
            f"no {LEDGER_NAME} in {directory}: not a run directory (fedsv launch --out) "
            "or a coordinator's --state-dir"
        )
    return path


def build_report(run_dir: str | Path) -> dict[str, Any]:
    """The JSON-serializable report of the run in `run_dir` (its ledger opened read-only)."""
    path = _ledger_path(run_dir)
    with Ledger(path, read_only=True) as ledger:
        run = ledger.run_config()
        records, rows, traffic_rows = ledger.rounds(), ledger.values(), ledger.traffic()
        updates = ledger.updates()
    if run is None:
        raise ValueError(f"{path} records no run yet")
    # refuses value rows of rounds it has no record of; values every participant the run had
    valuation = federated_valuation(records, rows, _world(run[1]))
    rows_of: dict[int, list[ValueRow]] = {rec.round: [] for rec in records}
    for row in rows:
        rows_of[row.round].append(row)
    updates_of: dict[int, list[UpdateRow]] = {rec.round: [] for rec in records}
    for update in updates:
        updates_of.setdefault(update.round, []).append(update)
    traffic: dict[str, dict[str, dict[str, int]]] = {}
    for t in traffic_rows:
        cell = traffic.setdefault(t.rpc, {}).setdefault(t.direction, {"bytes": 0, "messages": 0})
        cell["bytes"] += t.bytes
        cell["messages"] += t.messages
    total_bytes = sum(rec.bytes_up + rec.bytes_down for rec in records)
    minimum = sum(rec.physical_minimum_bytes for rec in records)
    n = max(1, len(records))
    return {
        "run_id": run[0],
        "config": run[1],
        "rounds": [_round_entry(rec, rows_of[rec.round], updates_of[rec.round]) for rec in records],
        "totals": valuation.totals(),
        "stderr": {
            key: {pid: _num(e) for pid, e in errors.items()} for key, errors in valuation.errors().items()
        },
        "final_accuracy": _num(records[-1].test_accuracy) if records else None,
        "traffic": traffic,
        "summary": {
            "rounds": len(records),
            "participants": sorted({p for rec in records for p in rec.selected}),
            "bytes_up_per_round": sum(rec.bytes_up for rec in records) / n,
            "bytes_down_per_round": sum(rec.bytes_down for rec in records) / n,
            "bytes_per_round": total_bytes / n,
            "physical_minimum_bytes_per_round": minimum / n,
            "bytes_ratio_to_minimum": total_bytes / minimum if minimum > 0 else None,
            "corrupted": _corrupted(run[1]),
        },
    }


def _ranked(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per participant (every one ever selected), best FedSV first; never valued = 0.

    Each row's FedSV total comes with its standard error (None: unknown), and `separated_from_next` says
    whether it differs from the next rank's by more than Z95 combined standard errors (None for the last).
    """
    totals, errors = report["totals"], report.get("stderr", {})
    selected: dict[str, int] = {}
    samples: dict[str, int] = {}  # the count each declared in the last round it was aggregated in
    for entry in report["rounds"]:
        for pid in entry["selected"]:
            selected[pid] = selected.get(pid, 0) + 1
        samples.update(entry.get("num_samples", {}))
    ids = set(selected) | set(totals["fedsv"]) | set(totals.get("fedsv_completed", {}))
    rows: list[dict[str, Any]] = [
        {"participant": pid, "rounds_selected": selected.get(pid, 0), "num_samples": samples.get(pid)}
        | {key: float(totals[key].get(pid, 0.0)) for key in TOTAL_KEYS}
        | {f"{key}_stderr": errors.get(key, {}).get(pid, 0.0) for key in ("fedsv", "fedsv_normalized")}
        | {"fedsv_completed_stderr": errors.get("fedsv_completed", {}).get(pid)}
        for pid in ids
    ]
    rows.sort(key=lambda r: (-r["fedsv"], r["participant"]))
    for rank, row in enumerate(rows, start=1):
        row["rank_by_fedsv"] = rank
    for row, below in itertools.zip_longest(rows, rows[1:]):
        row["separated_from_next"] = None if below is None else separated(row, below)
    return rows


def separated(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether two FedSV totals differ at 95%; None when either's error is unknown."""
    if a["fedsv_stderr"] is None or b["fedsv_stderr"] is None:
        return None
    combined = math.hypot(a["fedsv_stderr"], b["fedsv_stderr"])
    return abs(a["fedsv"] - b["fedsv"]) > Z95 * combined


def _plot(report: dict[str, Any], path: Path) -> None:
    """Cumulative FedSV per participant over rounds; per-round total value and test accuracy."""
    fig = Figure(figsize=(9, 7), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    rounds = [entry["round"] for entry in report["rounds"]]
    ranked = _ranked(report)
    for row in ranked:
        pid = row["participant"]
        cumulative = np.cumsum([entry["values"].get(pid, 0.0) for entry in report["rounds"]])
        top.plot(rounds, cumulative, marker=".", label=pid)
    top.set_ylabel("cumulative FedSV")
    top.set_title(f"run {report['run_id']}: federated Shapley value per participant")
    if 0 < len(ranked) <= 12:
        top.legend(fontsize="small", ncols=2)
    gains = [(e["utility_after"] or 0.0) - (e["utility_before"] or 0.0) for e in report["rounds"]]
    bottom.bar(rounds, gains, color="tab:blue", alpha=0.6, label="U_after - U_before")
    bottom.set_xlabel("round")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("round value (U_after - U_before)", color="tab:blue")
    accuracy_axis = bottom.twinx()
    accuracy = [math.nan if e["test_accuracy"] is None else e["test_accuracy"] for e in report["rounds"]]
    accuracy_axis.plot(rounds, accuracy, color="tab:red", marker="o", label="test accuracy")
    accuracy_axis.set_ylabel("test accuracy", color="tab:red")
    fig.savefig(path, dpi=110)


def write_outputs(run_dir: str | Path) -> dict[str, Path]:
    """Write report.json, values.csv and values.png into `run_dir`; returns them by file name."""
    report = build_report(run_dir)
    directory = Path(run_dir)
    out = {name: directory / name for name in ("report.json", "values.csv", "values.png")}
    out["report.json"].write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    with out["values.csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(_ranked(report))
    _plot(report, out["values.png"])
    logger.info("wrote %s", ", ".join(str(p) for p in out.values()))
    return out


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def _plus_minus(value: float, error: float | None, digits: int) -> str:
    """ "0.12345 ± 0.00012"; "± 0" for an exact value; "± ?" where the error is unknown."""
    if error is None:
        return f"{value:.{digits}f} ± ?"
    return f"{value:.{digits}f} ± {0 if error == 0 else f'{error:.{digits}f}':<{digits + 2}}"


def format_table(report: dict[str, Any]) -> str:
    """Participants ranked by FedSV, each value beside its standard error, under a header of accuracy and
    traffic; "~" marks a rank not separated from the next at 95%."""
    summary = report["summary"]
    accuracy = report["final_accuracy"]
    ratio = summary["bytes_ratio_to_minimum"]
    up, down = _bytes(summary["bytes_up_per_round"]), _bytes(summary["bytes_down_per_round"])
    lines = [
        f"run {report['run_id']}: {summary['rounds']} rounds, final test accuracy "
        + ("-" if accuracy is None else f"{accuracy:.4f}"),
        f"traffic: {_bytes(summary['bytes_per_round'])} per round (up {up}, down {down}); "
        + ("-" if ratio is None else f"{ratio:.3f}x")
        + f" the physical minimum of {_bytes(summary['physical_minimum_bytes_per_round'])}",
        "",
        f"{'rank':>5}  {'participant':<12} {'rounds':>6} {'samples':>8} {'fedsv ± stderr':>20} "
        f"{'fedsv_norm ± stderr':>20} {'completed ± stderr':>20} {'loo':>9} {'loo_norm':>9}",
    ]
    corrupted = summary.get("corrupted", {})
    ranked = _ranked(report)
    for row in ranked:
        mark = f"  (corrupted: {corrupted[row['participant']]})" if row["participant"] in corrupted else ""
        samples = "-" if row["num_samples"] is None else str(row["num_samples"])
        rank = f"{row['rank_by_fedsv']:>4}{'~' if row['separated_from_next'] is False else ' '}"
        lines.append(
            f"{rank}  {row['participant']:<12} {row['rounds_selected']:>6} {samples:>8} "
            f"{_plus_minus(row['fedsv'], row['fedsv_stderr'], 5):>20} "
            f"{_plus_minus(row['fedsv_normalized'], row['fedsv_normalized_stderr'], 4):>20} "
            f"{_plus_minus(row['fedsv_completed'], row['fedsv_completed_stderr'], 5):>20} "
            f"{row['loo']:>9.5f} {row['loo_normalized']:>9.4f}{mark}"
        )
    if any(row["separated_from_next"] is False for row in ranked):
        lines.append("\n~ not separated from the next rank at 95% (difference within 1.96 combined stderr)")
    return "\n".join(lines)
