"""report.html at a paper-scale study's size: the page's bytes and its render time in headless Chromium.

Usage: python benchmarks/bench_report_page.py [--run RUN_DIR] [--members 100] [--rounds 25] [--repeats 5]

Without --run, a report of `members` x `rounds` (10 selected per round, 10 labels, values with errors)
is made up; with it, the run's own report (build_report). Render time: wall time of headless Chromium
loading the page to the end of its scripts (`--dump-dom`, which waits for them), less the same for an
empty page (the browser's own start), median of `repeats`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from fixtures import machine, print_table

from fedsv.app.report import build_report
from fedsv.app.report_page import render_page

KEYS = ("fedsv", "fedsv_normalized", "fedsv_completed", "fedsv_shrunk", "loo", "loo_normalized")


def made_up(members: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    ids = [f"p{i:03d}" for i in range(members)]
    entries = []
    for t in range(1, rounds + 1):
        chosen = sorted(rng.choice(members, size=max(1, members // 10), replace=False))
        picked = [ids[i] for i in chosen]
        entries.append({
            "round": t, "selected": picked, "received": picked, "absent": {}, "status": "valued",
            "values": {pid: float(rng.normal(0.01 / t, 0.005)) for pid in picked}, "test_accuracy": 0.8,
        })  # fmt: skip
    totals = {key: {pid: float(rng.normal(0.02, 0.01)) for pid in ids} for key in KEYS}
    errors = {key: dict.fromkeys(ids, 0.01) for key in KEYS}
    return {
        "run_id": "made-up", "config": {"participants": members, "rounds": rounds}, "rounds": entries,
        "recommended": "fedsv_shrunk", "totals": totals, "stderr": errors, "stderr_between": errors,
        "pending_rounds": [], "verdict": {"line": "verdict: made up", "groups": [ids]},
        "classes": {"labels": 10, "totals": {pid: rng.normal(0, 0.002, 10).tolist() for pid in ids}},
        "final_accuracy": 0.8,
        "summary": {"participants": ids, "bytes_per_round": 1e7, "bytes_ratio_to_minimum": 1.0},
    }  # fmt: skip


def load_seconds(chromium: str, page: Path, profile: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--window-size=1280,800", "--dump-dom", page.as_uri()],
        capture_output=True, timeout=300, check=True,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="")
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    report = build_report(args.run) if args.run else made_up(args.members, args.rounds)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        page, empty = folder / "report.html", folder / "empty.html"
        started = time.perf_counter()
        page.write_text(render_page(report))
        written = time.perf_counter() - started
        empty.write_text("<!DOCTYPE html><html><body>empty</body></html>")
        load_seconds(chromium, empty, folder / "profile")  # a first start fills the profile
        base = [load_seconds(chromium, empty, folder / "profile") for _ in range(args.repeats)]
        full = [load_seconds(chromium, page, folder / "profile") for _ in range(args.repeats)]
        members = len(report["summary"]["participants"])
        print(f"machine: {machine()}\n")
        print_table(
            ["members", "rounds", "page MB", "written in s", "render s (median, less an empty page's)"],
            [[str(members), str(len(report["rounds"])), f"{page.stat().st_size / 1e6:.2f}", f"{written:.2f}",
              f"{statistics.median(full) - statistics.median(base):.2f} ({statistics.median(full):.2f} - "
              f"{statistics.median(base):.2f})"]],
        )  # fmt: skip
        print(json.dumps({"page_bytes": page.stat().st_size, "load_s": full, "empty_s": base}))


if __name__ == "__main__":
    main()
