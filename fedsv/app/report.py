"""`fedsv report`: a run's values, accuracy and traffic from its ledger, as JSON, CSV, a plot and a table."""

from __future__ import annotations

import csv
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
CSV_COLUMNS = ("participant", "rounds_selected", "num_samples", *TOTAL_KEYS, "rank_by_fedsv")


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
    valuation = federated_valuation(records, rows)  # refuses value rows of rounds it has no record of
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
    """One row per participant (every one ever selected), best FedSV first; never valued = 0."""
    totals = report["totals"]
    selected: dict[str, int] = {}
    samples: dict[str, int] = {}  # the count each declared in the last round it was aggregated in
    for entry in report["rounds"]:
        for pid in entry["selected"]:
            selected[pid] = selected.get(pid, 0) + 1
        samples.update(entry.get("num_samples", {}))
    ids = set(selected) | set(totals["fedsv"])
    rows: list[dict[str, Any]] = [
        {"participant": pid, "rounds_selected": selected.get(pid, 0), "num_samples": samples.get(pid)}
        | {key: float(totals[key].get(pid, 0.0)) for key in TOTAL_KEYS}
        for pid in ids
    ]
    rows.sort(key=lambda r: (-r["fedsv"], r["participant"]))
    for rank, row in enumerate(rows, start=1):
        row["rank_by_fedsv"] = rank
    return rows


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


def format_table(report: dict[str, Any]) -> str:
    """Participants ranked by FedSV with the four totals, under a header of accuracy and traffic."""
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
        f"{'rank':>4}  {'participant':<12} {'rounds':>6} {'samples':>8} {'fedsv':>10} {'fedsv_norm':>10} "
        f"{'loo':>10} {'loo_norm':>10}",
    ]
    corrupted = summary.get("corrupted", {})
    for row in _ranked(report):
        mark = f"  (corrupted: {corrupted[row['participant']]})" if row["participant"] in corrupted else ""
        samples = "-" if row["num_samples"] is None else str(row["num_samples"])
        lines.append(
            f"{row['rank_by_fedsv']:>4}  {row['participant']:<12} {row['rounds_selected']:>6} {samples:>8} "
            f"{row['fedsv']:>10.5f} {row['fedsv_normalized']:>10.4f} {row['loo']:>10.5f} "
            f"{row['loo_normalized']:>10.4f}{mark}"
        )
    return "\n".join(lines)
