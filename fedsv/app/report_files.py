"""A run's report files: report.json, values.csv, the figures and report.html, written into its directory."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

from fedsv.app.live_page import write_page
from fedsv.app.report import CSV_COLUMNS, build_report, ranked_rows
from fedsv.app.report_figures import plot_classes, plot_values

logger = logging.getLogger(__name__)


def write_outputs(run_dir: str | Path) -> dict[str, Path]:
    """Write report.json, values.csv (a participant a row, its values per label in columns fedsv_label_K),
    values.png, where rounds were valued by label class_values.png, and report.html into `run_dir`."""
    report = build_report(run_dir)
    directory = Path(run_dir)
    names = ["report.json", "values.csv", "values.png"] + (
        ["class_values.png"] if report["classes"]["labels"] else []
    )
    out = {name: directory / name for name in names}
    out["report.json"].write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    ranked = ranked_rows(report)
    labels = [f"fedsv_label_{label}" for label in range(report["classes"]["labels"])]
    with out["values.csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*CSV_COLUMNS, *labels], extrasaction="ignore")
        writer.writeheader()
        for row in ranked:
            by_label = report["classes"]["totals"].get(row["participant"], [])
            writer.writerow(row | dict(zip(labels, by_label, strict=False)))
    plot_values(report, ranked, out["values.png"])
    if "class_values.png" in out:
        plot_classes(report, ranked, out["class_values.png"])
    out["report.html"] = write_page(directory, report)
    logger.info("wrote %s", ", ".join(str(p) for p in out.values()))
    return out
