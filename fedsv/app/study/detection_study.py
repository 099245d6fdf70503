"""The noisy-label and backdoor detection studies: corrupted runs through the runtime, curves and areas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedsv.app.study.config import StudyConfig, bad_ranks, corrupt_spec
from fedsv.app.study.detection import (
    DETECTION_METHODS,
    RANDOM_EXPECTED_AREA,
    curve_area,
    detection_curve,
    method_scores,
    value_totals,
)
from fedsv.app.study.runner import Runner, RunResult
from fedsv.data.corruptions import backdoor_success_rate, parse_corruption
from fedsv.fl.state import load_params
from fedsv.task.models import build_model


def stats(values: list[float]) -> dict[str, Any]:
    """Mean, standard deviation (over seeds) and the per-seed values."""
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std()), "per_seed": [float(v) for v in arr]}


def setting_name(partition: str, model: str) -> str:
    return f"{partition}-{model}"


def _corruption(study: str, config: StudyConfig) -> str:
    if study == "noisy":
        return f"flip:{config.flip_ratio:g}" + (":own" if config.flip_to == "own" else "")
    return config.backdoor


def _backdoor_metrics(result: RunResult, config: StudyConfig, model_name: str, seed: int) -> float:
    """Backdoor success rate of the run's final global model on the triggered test images."""
    backdoor = parse_corruption(config.backdoor).backdoor
    assert backdoor is not None  # StudyConfig checked it
    splits = config.splits(seed)
    model = build_model(model_name, splits.input_shape, splits.num_classes, seed=seed)
    load_params(model, result.final_params())
    return backdoor_success_rate(model, splits.test.x, splits.test.y, backdoor)


def run_detection(
    study: str, config: StudyConfig, out: Path, runner: Runner
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every (setting, seed) of a detection study; returns (CSV points, the summary's settings)."""
    n = config.participants
    items = []
    keys = []
    for partition, model in config.settings():
        for seed in config.seed_list():
            bad = bad_ranks(n, config.bad_fraction, seed)
            if not bad:
                raise ValueError(f"bad_fraction {config.bad_fraction} of {n} participants corrupts nobody")
            run = config.base_run(seed, partition, model).changed(
                corrupt=corrupt_spec(bad, _corruption(study, config))
            )
            name = setting_name(partition, model)
            items.append((run, out / "runs" / name / f"seed{seed}", f"{study} {name} seed {seed}"))
            keys.append((partition, model, seed, bad))
    results = runner.run_many(items)
    points: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    for (partition, model, seed, bad), result in zip(keys, results, strict=True):
        entry = settings.setdefault(
            setting_name(partition, model),
            {
                "partition": partition,
                "model": model,
                "bad": {},
                "_areas": {},
                "_acc": [],
                "_rounds": [],
                "_cost": [],
            },
        )
        entry["bad"][str(seed)] = bad
        flags = np.isin(np.arange(n), bad)
        scores = method_scores(value_totals(result.valuation(), n), n)
        for method in DETECTION_METHODS:
            curve = detection_curve(scores[method], flags)
            entry["_areas"].setdefault(method, []).append(curve_area(curve, len(bad)))
            for k, found in enumerate(curve):
                points.append(_point(study, config, partition, model, seed, method, k / n, float(found)))
        entry["_acc"].append(result.final_accuracy)
        entry["_cost"].append(run_cost(result))
        entry["_rounds"].append(_round_values(result))
        if study == "backdoor":
            rate = _backdoor_metrics(result, config, model, seed)
            entry.setdefault("_success", []).append(rate)
            points.append(_point(study, config, partition, model, seed, "backdoor_success_rate", 1.0, rate))
    return points, {name: _finish(entry) for name, entry in settings.items()}


def run_cost(result: RunResult) -> dict[str, float]:
    return {
        "valuation_seconds": result.valuation_seconds,
        "evaluations": float(result.evaluations),
        "run_seconds": result.seconds,
    }


def cost_stats(costs: list[dict[str, float]]) -> dict[str, Any]:
    """What the runs of a setting cost, mean and std over seeds: the valuation's seconds and utility
    evaluations per run, and each run's wall time (0 for a run reused from an earlier study)."""
    return {
        key: stats([cost[key] for cost in costs])
        for key in ("valuation_seconds", "evaluations", "run_seconds")
    }


def _point(
    study: str, config: StudyConfig, partition: str, model: str, seed: int, method: str, x: float, y: float
) -> dict[str, Any]:
    return {
        "study": study,
        "dataset": config.dataset,
        "partition": partition,
        "model": model,
        "seed": seed,
        "method": method,
        "draw": "",
        "x": round(x, 6),
        "y": y,
    }


def _round_values(result: RunResult) -> dict[str, list[float]]:
    """Per round: the FedSV total (= U_after - U_before for exact values) and the vector's L2 norm."""
    by_round: dict[int, list[float]] = {record.round: [] for record in result.rounds}
    for row in result.values:
        by_round[row.round].append(row.fedsv)
    return {
        "total": [float(np.sum(by_round[r])) for r in sorted(by_round)],
        "norm": [float(np.linalg.norm(by_round[r])) for r in sorted(by_round)],
    }


def _finish(entry: dict[str, Any]) -> dict[str, Any]:
    """Mean and std over seeds of every collected quantity."""
    out = {key: value for key, value in entry.items() if not key.startswith("_")}
    out["area"] = {method: stats(values) for method, values in entry["_areas"].items()}
    out["random_expected_area"] = RANDOM_EXPECTED_AREA
    out["final_accuracy"] = stats(entry["_acc"])
    if "_success" in entry:
        out["backdoor_success_rate"] = stats(entry["_success"])
        out["clean_accuracy"] = out["final_accuracy"]
    out.update(cost_stats(entry["_cost"]))
    rounds = entry["_rounds"]
    out["round_value_total"] = np.mean([r["total"] for r in rounds], axis=0).round(6).tolist()
    out["round_value_norm"] = np.mean([r["norm"] for r in rounds], axis=0).round(6).tolist()
    return out
