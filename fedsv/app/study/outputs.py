"""A study's files: points.csv (every curve point), summary.json, summary.md (tables) and the PNG figures."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from fedsv.app.study.detection import DETECTION_METHODS, LABELS
from fedsv.app.study.summarization import SUMMARY_METHODS

CSV_COLUMNS = ("study", "dataset", "partition", "model", "seed", "method", "draw", "x", "y")
COLORS = {
    "fedsv": "tab:blue",
    "loo": "tab:orange",
    "fedsv_normalized": "tab:green",
    "loo_normalized": "tab:red",
    "fedsv_completed": "tab:purple",
    "fedsv_shrunk": "tab:brown",
    "random": "tab:gray",
}


def _save(fig: Figure, path: Path) -> None:
    """PNG with a 128-colour palette: a quarter of the size, the same look (figures go into docs/)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=128).save(path, optimize=True)


def write_csv(points: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(points)


def _curves(
    points: list[dict[str, Any]], setting: str, method: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """x, mean over seeds, std over seeds of one method's curve (random draws averaged per seed first)."""
    by_seed: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if f"{p['partition']}-{p['model']}" == setting and p["method"] == method:
            by_seed[int(p["seed"])][float(p["x"])].append(float(p["y"]))
    if not by_seed:
        return None
    xs = sorted(next(iter(by_seed.values())))
    ys = np.array([[np.mean(curve[x]) for x in xs] for curve in by_seed.values()])
    return np.array(xs), ys.mean(axis=0), ys.std(axis=0)


def _grid(settings: list[str], title: str) -> tuple[Figure, list[Axes]]:
    cols = min(2, len(settings))
    rows = (len(settings) + cols - 1) // cols
    fig = Figure(figsize=(5.2 * cols, 3.9 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for extra in axes[len(settings) :]:
        extra.set_visible(False)
    fig.suptitle(title)
    return fig, axes


def detection_figure(study: str, points: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """One panel per setting, one line per method (mean over seeds, band ±1 std), optimal dashed."""
    settings = list(summary["settings"])
    what = "noisy-label" if study == "noisy" else "backdoor"
    title = f"{what} detection ({summary['config']['dataset']}, {len(summary['seeds'])} seeds)"
    fig, axes = _grid(settings, title)
    for ax, setting in zip(axes, settings, strict=False):
        entry = summary["settings"][setting]
        for method in DETECTION_METHODS:
            curve = _curves(points, setting, method)
            if curve is None:
                continue
            x, mean, std = curve
            area = entry["area"][method]["mean"]
            style = "--" if method == "random" else "-"
            ax.plot(x, mean, style, color=COLORS[method], label=f"{LABELS[method]} ({area:.2f})")
            ax.fill_between(x, mean - std, mean + std, color=COLORS[method], alpha=0.12)
        bad = len(next(iter(entry["bad"].values())))
        n = summary["config"]["participants"]
        ax.plot([0, bad / n, 1], [0, 1, 1], ":", color="black", linewidth=1, label="optimal")
        ax.set_title(f"{setting} ({bad} of {n} corrupted)")
        ax.set_xlabel("fraction of participants inspected (lowest value first)")
        ax.set_ylabel("fraction of corrupted found")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize="x-small", loc="lower right", title="method (area)", title_fontsize="x-small")
    _save(fig, path)


def round_values_figure(study: str, summary: dict[str, Any], path: Path) -> None:
    """Per-round L2 norm and total of the FedSV vector (mean over seeds), one line per setting."""
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    norm_ax, total_ax = fig.subplots(1, 2)
    for setting, entry in summary["settings"].items():
        rounds = np.arange(1, len(entry["round_value_norm"]) + 1)
        norm_ax.plot(rounds, entry["round_value_norm"], marker=".", label=setting)
        total_ax.plot(rounds, entry["round_value_total"], marker=".", label=setting)
    norm_ax.set_title("norm of the round's FedSV vector")
    total_ax.set_title("round's total FedSV (= U_t - U_t-1)")
    for ax in (norm_ax, total_ax):
        ax.set_xlabel("round")
        ax.legend(fontsize="small")
    fig.suptitle(f"{study}: per-round value over rounds (mean over seeds)")
    _save(fig, path)


def summarize_figure(points: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """One panel per setting: final test accuracy vs dismissed fraction q, one line per method."""
    settings = list(summary["settings"])
    title = f"data summarization ({summary['config']['dataset']}, {len(summary['seeds'])} seeds)"
    fig, axes = _grid(settings, title)
    for ax, setting in zip(axes, settings, strict=False):
        for method in SUMMARY_METHODS:
            curve = _curves(points, setting, method)
            if curve is None:
                continue
            x, mean, std = curve
            style = "--" if method == "random" else "-"
            ax.plot(x, mean, style, marker=".", color=COLORS[method], label=LABELS[method])
            ax.fill_between(x, mean - std, mean + std, color=COLORS[method], alpha=0.12)
        ax.set_title(setting)
        ax.set_xlabel("fraction q of each round's selected participants dismissed")
        ax.set_ylabel("final test accuracy")
        ax.legend(fontsize="small", loc="lower left")
    _save(fig, path)


def markdown(study: str, summary: dict[str, Any]) -> str:
    """The summary's tables in Markdown (docs/results.md quotes them)."""
    lines: list[str] = []
    if study in ("noisy", "backdoor"):
        extra = " backdoor success | clean acc. |" if study == "backdoor" else " final acc. |"
        extra += " valuation s / run | evaluations / run |"
        head = "| setting | " + " | ".join(LABELS[m] for m in DETECTION_METHODS) + " |" + extra
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for setting, entry in summary["settings"].items():
            areas = [entry["area"][m] for m in DETECTION_METHODS]
            cells = [f"{a['mean']:.3f} ± {a['std']:.3f}" for a in areas]
            if study == "backdoor":
                tail = [entry["backdoor_success_rate"], entry["clean_accuracy"]]
            else:
                tail = [entry["final_accuracy"]]
            cells += [f"{t['mean']:.3f} ± {t['std']:.3f}" for t in tail]
            cells += _cost_cells(entry)
            lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    else:
        qs = list(next(iter(summary["settings"].values()))["accuracy"]["fedsv"])
        head = "| setting | method | " + " | ".join(f"q={q}" for q in qs) + " |"
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for setting, entry in summary["settings"].items():
            for method in SUMMARY_METHODS:
                row = entry["accuracy"][method]
                values = " | ".join(f"{row[q]:.3f}" for q in qs)
                lines.append(f"| {setting} | {LABELS[method]} | {values} |")
        lines.append("")
        for setting, entry in summary["settings"].items():
            seconds, evaluations = _cost_cells(entry)
            if seconds:
                lines.append(
                    f"{setting}: valuing an original run took {seconds} s, {evaluations} evaluations"
                )
    runs = summary.get("runs", {})
    if runs:
        lines += [
            "",
            f"{runs['launched']} runs launched, {runs['reused']} reused, {summary['wall_seconds']:.0f} s",
        ]
    return "\n".join(lines) + "\n"


def _cost_cells(entry: dict[str, Any]) -> list[str]:
    """Valuation seconds and utility evaluations per run (means over seeds); blank where not recorded."""
    if "valuation_seconds" not in entry:
        return ["", ""]
    return [f"{entry['valuation_seconds']['mean']:.1f}", f"{entry['evaluations']['mean']:,.0f}"]


def write_all(study: str, points: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> list[Path]:
    """Write every file of the study into `out`; returns their paths."""
    paths = [out / "points.csv", out / "summary.json", out / "summary.md", out / f"{study}.png"]
    write_csv(points, paths[0])
    paths[1].write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    paths[2].write_text(markdown(study, summary))
    if study == "summarize":
        summarize_figure(points, summary, paths[3])
    else:
        detection_figure(study, points, summary, paths[3])
        paths.append(out / f"{study}_round_values.png")
        round_values_figure(study, summary, paths[-1])
    return paths
