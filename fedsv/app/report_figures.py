"""The run's figures: cumulative FedSV per participant over rounds, and its values per label as a heat map."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_values(report: dict[str, Any], ranked: list[dict[str, Any]], path: Path) -> None:
    """Cumulative FedSV per participant over rounds; per-round total value and test accuracy."""
    fig = Figure(figsize=(9, 7), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    rounds = [entry["round"] for entry in report["rounds"]]
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


def plot_classes(report: dict[str, Any], ranked: list[dict[str, Any]], path: Path) -> None:
    """Participants (best FedSV first) by validation label: each one's FedSV earned on that label's
    samples, a diverging map centred on 0 (a member whose data harms one label stands out in red)."""
    classes = report["classes"]
    ids = [row["participant"] for row in ranked if row["participant"] in classes["totals"]]
    matrix = np.array([classes["totals"][pid] for pid in ids]) if ids else np.zeros((0, classes["labels"]))
    fig = Figure(
        figsize=(1.2 + 0.45 * max(classes["labels"], 1), 1.5 + 0.28 * max(len(ids), 1)), layout="constrained"
    )
    FigureCanvasAgg(fig)
    axis = fig.subplots()
    limit = float(np.abs(matrix).max()) if matrix.size else 1.0
    image = axis.imshow(matrix, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    axis.set_xticks(range(classes["labels"]))
    axis.set_xlabel("validation label")
    axis.set_yticks(range(len(ids)), ids, fontsize="small")
    axis.set_title(
        f"run {report['run_id']}: FedSV per label ({classes['rounds_split']}/{classes['rounds']} rounds)"
    )
    fig.colorbar(image, ax=axis, label="FedSV on the label's samples")
    fig.savefig(path, dpi=110)
