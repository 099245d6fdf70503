"""The data summarization study: an original valued run, then replays of its selection minus the dismissed."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from fedsv.app.study.config import StudyConfig
from fedsv.app.study.detection import value_totals
from fedsv.app.study.detection_study import cost_stats, run_cost, setting_name, stats
from fedsv.app.study.runner import Runner, RunResult
from fedsv.app.study.summarization import (
    Q_VALUES,
    SUMMARY_METHODS,
    is_original,
    replay_schedule,
    selection_spec,
)
from fedsv.settings.choices import ValuationMethod
from fedsv.settings.run import RunConfig


def _ranks(selection: dict[int, list[str]]) -> dict[int, list[int]]:
    """Participant ids ("p007") back to ranks."""
    return {number: [int(pid[1:]) for pid in ids] for number, ids in selection.items()}


def run_summarization(
    config: StudyConfig, out: Path, runner: Runner
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Originals first (valued), then every distinct replay at once; returns (CSV points, settings)."""
    n = config.participants
    originals = []
    for partition, model in config.settings():
        for seed in config.seed_list():
            name = setting_name(partition, model)
            run = config.base_run(seed, partition, model)
            originals.append(
                (run, out / "runs" / name / f"seed{seed}" / "original", f"summarize {name} seed {seed}")
            )
    original_results = runner.run_many(originals)

    # (setting index, method, q, draw) -> replay key; identical schedules share one replay.
    plan: list[tuple[int, str, float, int, str]] = []
    replays: dict[str, tuple[RunConfig, Path, str]] = {}
    for index, ((run, directory, label), result) in enumerate(zip(originals, original_results, strict=True)):
        selection = _ranks(result.selection())
        totals = value_totals(result.valuation(), n)
        for method in SUMMARY_METHODS:
            for draw in range(config.draws if method == "random" else 1):
                for q in Q_VALUES:
                    schedule = replay_schedule(selection, method, q, totals, run.seed, draw)
                    if is_original(schedule, selection):
                        plan.append((index, method, q, draw, ""))
                        continue
                    spec = selection_spec(schedule)
                    key = f"{index}:{spec}"
                    if key not in replays:
                        digest = hashlib.sha1(spec.encode()).hexdigest()[:10]
                        replay = run.changed(valuation=ValuationMethod.NONE, selection=spec)
                        where = directory.parent / f"replay-{digest}"
                        replays[key] = (replay, where, f"{label} replay {digest}")
                    plan.append((index, method, q, draw, key))
    runner.report(f"  {len(replays)} distinct replays for {len(plan)} (method, q, draw) points")
    keys = list(replays)
    replay_results = dict(zip(keys, runner.run_many([replays[k] for k in keys]), strict=True))
    return _collect(config, originals, original_results, plan, replay_results)


def _collect(
    config: StudyConfig,
    originals: list[tuple[RunConfig, Path, str]],
    original_results: list[RunResult],
    plan: list[tuple[int, str, float, int, str]],
    replay_results: dict[str, RunResult],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    points: list[dict[str, Any]] = []
    # setting -> method -> q -> seed -> accuracies (one per draw)
    table: dict[str, dict[str, dict[float, dict[int, list[float]]]]] = {}
    for index, method, q, draw, key in plan:
        run = originals[index][0]
        final = (replay_results[key] if key else original_results[index]).final_accuracy
        name = setting_name(run.partition, run.model)
        table.setdefault(name, {}).setdefault(method, {}).setdefault(q, {}).setdefault(run.seed, []).append(
            final
        )
        points.append(
            {
                "study": "summarize",
                "dataset": config.dataset,
                "partition": run.partition,
                "model": run.model,
                "seed": run.seed,
                "method": method,
                "draw": draw if method == "random" else "",
                "x": q,
                "y": final,
            }
        )
    settings: dict[str, Any] = {}
    for name, methods in table.items():
        partition, model = name.split("-", 1)
        accuracy: dict[str, dict[str, float]] = {}
        accuracy_std: dict[str, dict[str, float]] = {}
        for method, by_q in methods.items():
            for q, by_seed in sorted(by_q.items()):
                # random: the mean of the draws per seed, then mean and std over seeds
                per_seed = [float(np.mean(draws)) for _, draws in sorted(by_seed.items())]
                summary = stats(per_seed)
                accuracy.setdefault(method, {})[f"{q:.1f}"] = round(summary["mean"], 6)
                accuracy_std.setdefault(method, {})[f"{q:.1f}"] = round(summary["std"], 6)
        originals_here = [
            r
            for (run, _, _), r in zip(originals, original_results, strict=True)
            if setting_name(run.partition, run.model) == name
        ]
        settings[name] = {
            "partition": partition,
            "model": model,
            "accuracy": accuracy,
            "accuracy_std": accuracy_std,
            "original_accuracy": stats([r.final_accuracy for r in originals_here]),
            **cost_stats([run_cost(r) for r in originals_here]),
        }
    return points, settings
