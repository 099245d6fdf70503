"""run_study: resolve the config, run the study's runs, write points.csv, summary.json and figures."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsv.app.study.config import StudyConfig
from fedsv.app.study.detection_study import run_detection
from fedsv.app.study.outputs import write_all
from fedsv.app.study.runner import Runner
from fedsv.app.study.summarize_study import run_summarization


def run_study(study: str, config: StudyConfig, report: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one study end to end; returns its summary (also written to <out>/summary.json)."""
    resolved = config.resolved(study)
    out = Path(resolved.out or f"runs/study-{study}")
    resolved = resolved.changed(out=str(out))
    out.mkdir(parents=True, exist_ok=True)
    (out / "study_config.json").write_text(json.dumps(resolved.to_dict(), indent=2) + "\n")
    runner = Runner(resolved.jobs, resolved.processes, resolved.run_timeout, report, resolved.device)
    settings = ", ".join(f"{p}-{m}" for p, m in resolved.settings())
    report(
        f"fedsv study {study}: {settings} on {resolved.dataset}; seeds {resolved.seed_list()}; "
        f"N={resolved.participants}, C={resolved.fraction}, T={resolved.rounds}; "
        f"{resolved.jobs} runs at once; out={out}"
    )
    # The data set must load here before any run starts: a wrong path is one clear error, not N failed runs.
    resolved.splits(resolved.seed)
    started = time.time()
    if study == "summarize":
        points, per_setting = run_summarization(resolved, out, runner)
    else:
        points, per_setting = run_detection(study, resolved, out, runner)
    summary = {
        "study": study,
        "config": resolved.to_dict(),
        "seeds": resolved.seed_list(),
        "settings": per_setting,
        "runs": {
            "launched": runner.launched,
            "reused": runner.reused,
            "launch_seconds": round(runner.launch_seconds, 1),
        },
        "wall_seconds": round(time.time() - started, 1),
    }
    paths = write_all(study, points, summary, out)
    report(
        f"fedsv study {study}: {runner.launched} runs launched, {runner.reused} reused, "
        f"{summary['wall_seconds']:.0f} s; wrote " + ", ".join(str(p) for p in paths)
    )
    return summary
