"""Peer Shapley estimators (shapiq, pyDVL) on a cached round table, for benchmarks/bench_estimators.py.

Runs inside benchmarks/.peers-venv (Python >= 3.12, see setup_peers.sh); imports neither fedsv nor torch.

Usage: peer_runner.py REQUEST.json RESPONSE.json
  REQUEST: {"table": path to round-m{m}-seed{s}.npz, "m": m, "budgets": [...], "seeds": S,
            "methods": null or ["shapiq:KernelSHAP", "pydvl:TMC", ...]}
  RESPONSE: {"versions": {...}, "notes": [...], "runs": [{"source", "method", "budget", "seed",
            "values", "distinct", "calls", "seconds", "error"}, ...]}

Every run looks coalitions up in the table (bitmask b = coalition with bit i for player i) through a
counter of the DISTINCT coalitions it evaluated ("distinct") and of all utility calls ("calls"); the
bench reports "distinct" as the evaluations a peer used, whatever budget it was asked for.

Budgets: shapiq's approximate(budget, game) counts game calls itself. pyDVL's stopping criteria count
samples, updates or checks, not utility evaluations, so pyDVL runs stop with DistinctEvaluations, a
pyDVL StoppingCriterion that reads this counter: it stops at the first check with distinct >= budget,
so a run can overshoot by the evaluations of one batch (one permutation: up to m + 1).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import numpy.typing as npt

warnings.filterwarnings("ignore")

FloatArray = npt.NDArray[np.float64]

CALLS_CAP = 20
"""A pyDVL run also stops after CALLS_CAP x budget utility calls (repeats included)."""

PYDVL_TIME_LIMIT_S = 300.0
"""A pyDVL run that has not reached its budget by then is stopped (MaxTime) and reported as is."""


class Counter:
    """The table lookup shared by one run: distinct coalitions (bitmasks) seen and utility calls made."""

    def __init__(self, table: FloatArray, m: int) -> None:
        self.table = table
        self.m = m
        self.bits = np.left_shift(np.int64(1), np.arange(m, dtype=np.int64))
        self.seen: set[int] = set()
        self.calls = 0

    def rows(self, members: npt.NDArray[np.bool_]) -> FloatArray:
        masks = np.asarray(members, dtype=np.int64).reshape(-1, self.m) @ self.bits
        self.calls += int(masks.shape[0])
        self.seen.update(int(b) for b in masks)
        return np.asarray(self.table[masks], dtype=np.float64)

    def subset(self, indices: Any) -> float:
        mask = 0
        for i in np.asarray(indices, dtype=np.int64).reshape(-1):
            mask |= 1 << int(i)
        self.calls += 1
        self.seen.add(mask)
        return float(self.table[mask])

    @property
    def distinct(self) -> int:
        return len(self.seen)


@dataclass
class Run:
    values: FloatArray
    counter: Counter


Runner = Callable[[FloatArray, int, int, int], Run]
"""runner(table, m, budget, seed) -> Run"""


# --------------------------------------------------------------------------- shapiq


def shapiq_runners(notes: list[str]) -> dict[str, Runner]:
    try:
        import shapiq
        import shapiq.approximator as approx
    except Exception as exc:  # the table says so and the rest still runs
        notes.append(f"shapiq unavailable: {type(exc).__name__}: {exc}")
        return {}

    class TableGame(shapiq.Game):
        """shapiq game over the table; normalize=False: values are of U itself, U(empty) included."""

        def __init__(self, counter: Counter) -> None:
            self.counter = counter
            super().__init__(n_players=counter.m, normalize=False)

        def value_function(self, coalitions: npt.NDArray[np.bool_]) -> FloatArray:
            return self.counter.rows(coalitions)

    def make(factory: Callable[[int, int], Any]) -> Runner:
        def run(table: FloatArray, m: int, budget: int, seed: int) -> Run:
            counter = Counter(table, m)
            estimator = factory(m, seed)
            result = estimator.approximate(budget, TableGame(counter))
            values = np.array([float(result[(i,)]) for i in range(m)], dtype=np.float64)
            return Run(values, counter)

        return run

    try:
        import xgboost  # noqa: F401

        msr_proxy = "xgboost"
    except ImportError:
        msr_proxy = "tree"
        notes.append("shapiq RegressionMSR: xgboost missing, proxy 'tree' (sklearn) instead of its default")
    wanted: dict[str, tuple[str, Callable[[Any], Callable[[int, int], Any]]]] = {
        f"RegressionMSR ({msr_proxy})": (
            "RegressionMSR",
            lambda c: lambda m, s: c(m, index="SV", proxy_model=msr_proxy, random_state=s),
        ),
        "SVARM": ("SVARM", lambda c: lambda m, s: c(m, index="SV", random_state=s)),
        "StratifiedSamplingSV": ("StratifiedSamplingSV", lambda c: lambda m, s: c(m, random_state=s)),
        "KernelSHAP (paired)": (
            "KernelSHAP",
            lambda c: lambda m, s: c(m, pairing_trick=True, random_state=s),
        ),
        "LeverageSHAP": ("LeverageSHAP", lambda c: lambda m, s: c(m, random_state=s)),
        "PermutationSamplingSV": ("PermutationSamplingSV", lambda c: lambda m, s: c(m, random_state=s)),
        "OwenSamplingSV": ("OwenSamplingSV", lambda c: lambda m, s: c(m, random_state=s)),
        "UnbiasedKernelSHAP": ("UnbiasedKernelSHAP", lambda c: lambda m, s: c(m, random_state=s)),
    }
    notes.append("shapiq games: normalize=False (U itself, U(empty) evaluated like any coalition)")
    runners: dict[str, Runner] = {}
    for label, (class_name, bind) in wanted.items():
        cls = getattr(approx, class_name, None)
        if cls is None:
            notes.append(f"shapiq {shapiq.__version__} has no approximator {class_name}")
            continue
        runners[f"shapiq:{label}"] = make(bind(cls))
    return runners


# --------------------------------------------------------------------------- pyDVL


def pydvl_runners(notes: list[str]) -> dict[str, Runner]:
    try:
        from joblib import parallel_config
        from pydvl.valuation import (
            Dataset,
            MaxTime,
            MSRSampler,
            PermutationSampler,
            ShapleyValuation,
            Status,
            StoppingCriterion,
            StratifiedShapleyValuation,
            TMCShapleyValuation,
        )
        from pydvl.valuation.utility.base import UtilityBase
    except Exception as exc:
        notes.append(f"pyDVL unavailable: {type(exc).__name__}: {exc}")
        return {}

    class TableUtility(UtilityBase):
        """pyDVL utility over the table; copies made by with_dataset() share the counter."""

        def __init__(self, counter: Counter) -> None:
            self.counter = counter

        def __call__(self, sample: Any) -> float:
            subset = () if sample is None else sample.subset
            return self.counter.subset(subset)

    class DistinctEvaluations(StoppingCriterion):
        """Stop once the run's table lookup has seen `budget` distinct coalitions (or made CALLS_CAP x budget
        utility calls: a budget near 2^m may never be reached by a random sampler)."""

        def __init__(self, counter: Counter, budget: int) -> None:
            super().__init__(modify_result=True)
            self.counter = counter
            self.budget = budget

        def _check(self, result: Any) -> Any:
            if self.counter.distinct >= self.budget or self.counter.calls >= CALLS_CAP * self.budget:
                self._converged = np.full_like(result.indices, True, dtype=bool)
                return Status.Converged
            self._converged = np.full_like(result.indices, False, dtype=bool)
            return Status.Pending

        def completion(self) -> float:
            return min(1.0, self.counter.distinct / self.budget)

        def __str__(self) -> str:
            return f"DistinctEvaluations({self.budget})"

    def make(build: Callable[[Any, Any, int], Any]) -> Runner:
        def run(table: FloatArray, m: int, budget: int, seed: int) -> Run:
            counter = Counter(table, m)
            data = Dataset(np.arange(m, dtype=np.float64).reshape(-1, 1), np.zeros(m))
            stop = DistinctEvaluations(counter, budget) | MaxTime(PYDVL_TIME_LIMIT_S)
            valuation = build(TableUtility(counter), stop, seed)
            with parallel_config(n_jobs=1):  # in-process, so the counter sees every evaluation
                valuation.fit(data)
            result = valuation.result
            values = np.zeros(m, dtype=np.float64)
            values[np.asarray(result.indices, dtype=np.int64)] = np.asarray(result.values, dtype=np.float64)
            return Run(values, counter)

        return run

    notes.append(
        "pyDVL stops on DistinctEvaluations(budget) (a pyDVL StoppingCriterion on the distinct coalitions "
        "the table lookup saw, checked after each batch; MaxSamples/MaxUpdates count samples and updates, "
        "not evaluations), so it can overshoot by one batch; n_jobs=1"
    )
    notes.append(
        "pyDVL MSR: MSRSampler is pyDVL's Banzhaf sampler; under ShapleyValuation it reweights uniform "
        "subsets by the Shapley coefficients (the only Shapley MSR pyDVL offers)"
    )
    return {
        "pydvl:MSR (MSRSampler, Shapley weights)": make(
            lambda u, stop, s: ShapleyValuation(u, MSRSampler(seed=s), stop, progress=False)
        ),
        "pydvl:TMC": make(lambda u, stop, s: TMCShapleyValuation(u, is_done=stop, seed=s, progress=False)),
        "pydvl:Permutation": make(
            lambda u, stop, s: ShapleyValuation(u, PermutationSampler(seed=s), stop, progress=False)
        ),
        "pydvl:Stratified": make(
            lambda u, stop, s: StratifiedShapleyValuation(u, is_done=stop, seed=s, progress=False)
        ),
    }


# --------------------------------------------------------------------------- main


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("shapiq", "pydvl", "numpy", "xgboost-cpu", "xgboost", "scikit-learn"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        request = json.load(fh)
    m = int(request["m"])
    with np.load(request["table"], allow_pickle=False) as data:
        table = np.asarray(data["utilities"], dtype=np.float64)
    if table.shape != (2**m,):
        raise SystemExit(f"table {request['table']} has {table.shape[0]} entries, not 2^{m}")
    notes: list[str] = []
    runners = {**shapiq_runners(notes), **pydvl_runners(notes)}
    wanted = request.get("methods")
    if wanted:
        unknown = [w for w in wanted if w not in runners]
        notes.extend(f"unknown or unavailable peer {w!r}" for w in unknown)
        runners = {k: v for k, v in runners.items() if k in wanted}
    runs: list[dict[str, Any]] = []
    for budget in request["budgets"]:
        for name, runner in runners.items():
            source, method = name.split(":", 1)
            started = time.perf_counter()
            failed = None
            for seed in range(int(request["seeds"])):
                row: dict[str, Any] = {"source": source, "method": method, "budget": budget, "seed": seed}
                try:
                    start = time.perf_counter()
                    outcome = runner(table, m, int(budget), seed)
                    row["seconds"] = time.perf_counter() - start
                    row["values"] = [float(v) for v in outcome.values]
                    row["distinct"] = outcome.counter.distinct
                    row["calls"] = outcome.counter.calls
                except Exception as exc:
                    failed = f"{type(exc).__name__}: {exc}"
                    row["error"] = failed
                    traceback.print_exc()
                runs.append(row)
                if failed:
                    break  # one failure per estimator is enough
            status = f"FAILED ({failed})" if failed else f"{time.perf_counter() - started:.1f} s"
            print(f"  {source} {method} budget {budget}: {status}", flush=True)
    with open(argv[2], "w", encoding="utf-8") as fh:
        json.dump({"versions": versions(), "notes": notes, "runs": runs}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
