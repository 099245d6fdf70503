"""Accuracy per utility evaluation of fedsv's Shapley estimators, side by side with shapiq's and pyDVL's.

Usage: python benchmarks/bench_estimators.py [--players 16] [--budgets 500,2000,5000] [--seeds 10]
           [--methods regression,svarm,...] [--no-peers] [--peer-methods NAME,...] [--table-only]
           [--json PATH]

One real FedAvg round (the paper's MLP on the embedded MNIST sample, m IID participants, the deltas of
round 2 after local training; see bench_valuation.train_round) is turned into its RoundGame, and the
utilities of ALL 2^m coalitions are computed once (mode "fast", CPU) and cached in
benchmarks/.cache/round-m{m}-seed{seed}.npz. The exact Shapley values come from that table.

Every estimator then runs on a game that looks coalitions up in the table (a fresh game per run, so its
memo starts empty) with the same budget of DISTINCT utility evaluations:

* fedsv: every method of fedsv.valuation.estimators.spec.SAMPLING_METHODS through
  shapley_values(game, spec=ValuationSpec(method, budget=B, seed=s)); evaluations <= B is asserted.
* peers (unless --no-peers): shapiq's and pyDVL's Shapley estimators, run by benchmarks/peers/
  peer_runner.py inside benchmarks/.peers-venv (Python 3.12; create it with
  benchmarks/peers/setup_peers.sh). The peers see the same table through a lookup that counts the
  distinct coalitions each run really evaluated; that count is what the tables report.

Per budget one table: median and 90th percentile over seeds of max_i |value_i - exact_i|, the median's
ratio to the best peer's, mean |bias| over players (bias = mean signed error over seeds), the
calibration of the reported stderr (median reported stderr / std of the estimates across seeds;
fedsv only), the distinct evaluations used and the seconds per run; then the measured coverage
P(max error <= eps) over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fixtures import TRAIN_CONFIG, TRAIN_ROUNDS, load_average, machine, print_table, train_round

from fedsv.data import load_dataset
from fedsv.valuation.estimators.exact import all_coalitions, shapley_from_table
from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game

HERE = Path(__file__).resolve().parent
CACHE_DIR = HERE / ".cache"
PEERS_VENV = HERE / ".peers-venv"
PEER_RUNNER = HERE / "peers" / "peer_runner.py"
SETUP_PEERS = HERE / "peers" / "setup_peers.sh"

TABLE_FORMAT = 1
"""Bumped whenever what a cached table means changes (so an older cache is rebuilt, not reused)."""

VALIDATION_SIZE = 1000
"""Validation samples the round's utility (accuracy of the aggregated model) is measured on."""

DATA_SEED = 0
"""Seed of the embedded data set's train/validation split."""

COVERAGE_EPS = (0.005, 0.01)
"""Accuracies of the measured coverage P(max_i |value_i - exact_i| <= eps)."""

TABLE_CHUNK = 1 << 14
"""Coalitions per RoundGame call while building the table (progress is printed between chunks)."""


# --------------------------------------------------------------------------- the round's table


def table_settings(m: int, seed: int) -> dict[str, Any]:
    """Everything that determines a round's utility table; a cache made under other settings is stale."""
    return {
        "format": TABLE_FORMAT,
        "m": m,
        "seed": seed,
        "model": "mlp",
        "data": "embedded",
        "data_seed": DATA_SEED,
        "validation_size": VALIDATION_SIZE,
        "partition": "iid",
        "train_config": asdict(TRAIN_CONFIG),
        "train_rounds": TRAIN_ROUNDS,
        "game_mode": "fast",
        "metric": "accuracy",
        "torch": torch.__version__.split("+")[0],
    }


def table_path(m: int, seed: int) -> Path:
    return CACHE_DIR / f"round-m{m}-seed{seed}.npz"


@dataclass
class RoundTable:
    """The utilities of all 2^m coalitions of one round, indexed by bitmask, and its exact Shapley values."""

    m: int
    seed: int
    utilities: FloatArray
    exact: FloatArray
    path: Path
    describe: str
    build_seconds: float
    cached: bool


def load_table(m: int, seed: int) -> RoundTable | None:
    """The cached table of (m, seed), or None if there is none or it was made under other settings."""
    path = table_path(m, seed)
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as data:
        settings = json.loads(str(data["settings"]))
        if settings != table_settings(m, seed):
            print(f"cache {path} was made under other settings; rebuilding", flush=True)
            return None
        return RoundTable(
            m,
            seed,
            np.asarray(data["utilities"], dtype=np.float64),
            np.asarray(data["exact"], dtype=np.float64),
            path,
            str(data["describe"]),
            float(data["build_seconds"]),
            cached=True,
        )


def build_table(m: int, seed: int) -> RoundTable:
    """Train the round, evaluate all 2^m coalitions with RoundGame (mode "fast"), cache the table."""
    started = time.perf_counter()
    splits = load_dataset("embedded", seed=DATA_SEED, validation_size=VALIDATION_SIZE)
    rnd = train_round(
        "mlp", splits.train.x, splits.train.y, splits.validation.x, splits.validation.y, m, seed=seed
    )
    trained = time.perf_counter()
    print(f"  trained the round in {trained - started:.1f} s: {rnd.describe}", flush=True)
    game = rnd.game("fast")
    members = all_coalitions(m)
    utilities = np.empty(2**m, dtype=np.float64)
    report_every = max(1, (2**m // TABLE_CHUNK) // 10)
    for k, start in enumerate(range(0, 2**m, TABLE_CHUNK)):
        stop = min(2**m, start + TABLE_CHUNK)
        utilities[start:stop] = game.utilities(members[start:stop])
        if (k + 1) % report_every == 0:
            print(f"  {stop}/{2**m} coalitions, {time.perf_counter() - trained:.1f} s", flush=True)
    evaluated = time.perf_counter()
    exact = shapley_from_table(members, utilities)
    describe = f"{rnd.describe}; {VALIDATION_SIZE} validation samples, accuracy"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = table_path(m, seed)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(
        tmp,
        utilities=utilities,
        exact=exact,
        settings=np.array(json.dumps(table_settings(m, seed), sort_keys=True)),
        describe=np.array(describe),
        build_seconds=np.array(evaluated - trained),
    )
    tmp.replace(path)
    return RoundTable(m, seed, utilities, exact, path, describe, evaluated - trained, cached=False)


def round_table(m: int, seed: int) -> RoundTable:
    table = load_table(m, seed)
    if table is None:
        print(f"building the utility table of m={m} (2^{m} = {2**m} coalitions, RoundGame 'fast', CPU)")
        table = build_table(m, seed)
    return table


class TableGame(Game):
    """A game whose utilities are looked up in a table of all 2^m coalitions (vectorised bitmask lookup)."""

    def __init__(self, utilities: FloatArray) -> None:
        m = int(np.log2(utilities.shape[0]))
        if utilities.shape != (2**m,):
            raise ValueError(f"a table needs 2^m entries, got {utilities.shape}")
        super().__init__(m)
        self.table = utilities
        self._bits = np.left_shift(np.int64(1), np.arange(m, dtype=np.int64))

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        masks = members.astype(np.int64) @ self._bits
        return self.table[masks]


# --------------------------------------------------------------------------- runs and their statistics


@dataclass
class Cell:
    """All seeds of one estimator at one budget."""

    source: str  # "fedsv", "shapiq" or "pydvl"
    method: str
    budget: int
    values: list[list[float]] = field(default_factory=list)
    evaluations: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)  # peers: utility calls including repeats
    seconds: list[float] = field(default_factory=list)
    stderr: list[list[float]] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        return self.method if self.source == "fedsv" else f"[{self.source}] {self.method}"


@dataclass
class Stats:
    median_max_error: float
    p90_max_error: float
    max_errors: list[float]
    mean_abs_bias: float
    bias: list[float]
    calibration: float | None
    median_evaluations: float
    max_evaluations: int
    median_calls: float
    median_seconds: float
    coverage: dict[str, float]


def cell_stats(cell: Cell, exact: FloatArray) -> Stats | None:
    if not cell.values:
        return None
    values = np.asarray(cell.values, dtype=np.float64)  # (seeds, m)
    errors = values - exact[None, :]
    max_errors = np.max(np.abs(errors), axis=1)
    bias = errors.mean(axis=0)
    calibration: float | None = None
    if cell.stderr and len(cell.stderr) == len(cell.values) and values.shape[0] > 1:
        spread = values.std(axis=0, ddof=1)
        reported = np.median(np.asarray(cell.stderr, dtype=np.float64), axis=0)
        ok = spread > 0
        if np.any(ok):
            calibration = float(np.median(reported[ok] / spread[ok]))
    return Stats(
        median_max_error=float(np.median(max_errors)),
        p90_max_error=float(np.percentile(max_errors, 90)),
        max_errors=[float(e) for e in max_errors],
        mean_abs_bias=float(np.mean(np.abs(bias))),
        bias=[float(b) for b in bias],
        calibration=calibration,
        median_evaluations=float(np.median(cell.evaluations)),
        max_evaluations=int(max(cell.evaluations)),
        median_calls=float(np.median(cell.calls)),
        median_seconds=float(np.median(cell.seconds)),
        coverage={f"{eps:g}": float(np.mean(max_errors <= eps)) for eps in COVERAGE_EPS},
    )


def run_fedsv(table: RoundTable, methods: Sequence[str], budgets: Sequence[int], seeds: int) -> list[Cell]:
    """Every fedsv method x budget x seed, each on a fresh table game; asserts evaluations <= budget."""
    from fedsv.valuation.estimators.api import shapley_values
    from fedsv.valuation.estimators.spec import ValuationSpec

    cells = []
    for budget in budgets:
        for method in methods:
            cell = Cell("fedsv", method, budget)
            started = time.perf_counter()
            try:
                for seed in range(seeds):
                    game = TableGame(table.utilities)
                    spec = ValuationSpec(method=method, budget=budget, seed=seed)
                    start = time.perf_counter()
                    result = shapley_values(game, spec=spec)
                    cell.seconds.append(time.perf_counter() - start)
                    assert game.evaluations <= budget, (
                        f"{method}: {game.evaluations} distinct evaluations > budget {budget}"
                    )
                    assert result.evaluations == game.evaluations, (method, result.evaluations)
                    cell.values.append([float(v) for v in result.values])
                    cell.evaluations.append(game.evaluations)
                    cell.calls.append(game.evaluations)
                    if result.stderr is not None:
                        cell.stderr.append([float(v) for v in result.stderr])
            except Exception as exc:  # one broken estimator must not hide the others' numbers
                cell.error = f"{type(exc).__name__}: {exc}"
            cells.append(cell)
            status = f"FAILED ({cell.error})" if cell.error else f"{time.perf_counter() - started:.1f} s"
            print(f"  fedsv {method} budget {budget}: {status}", flush=True)
    return cells


@dataclass
class PeerReport:
    cells: list[Cell]
    versions: dict[str, str]
    notes: list[str]
    seconds: float


def peers_python() -> Path:
    return PEERS_VENV / "bin" / "python"


def run_peers(
    table: RoundTable, budgets: Sequence[int], seeds: int, methods: Sequence[str] | None, timeout: float
) -> PeerReport:
    """Run benchmarks/peers/peer_runner.py in the peers' virtualenv on the same table."""
    python = peers_python()
    if not python.exists():
        note = f"peers skipped: no {PEERS_VENV.relative_to(HERE.parent)}; create it with {SETUP_PEERS.name}"
        return PeerReport([], {}, [note], 0.0)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedsv-peers-") as tmp:
        request = Path(tmp) / "request.json"
        response = Path(tmp) / "response.json"
        request.write_text(
            json.dumps(
                {
                    "table": str(table.path),
                    "m": table.m,
                    "budgets": list(budgets),
                    "seeds": seeds,
                    "methods": None if methods is None else list(methods),
                }
            ),
            encoding="utf-8",
        )
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        env.pop("PYTHONPATH", None)  # the peers' interpreter must not see this repo's packages
        try:
            proc = subprocess.run(
                [str(python), str(PEER_RUNNER), str(request), str(response)],
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return PeerReport([], {}, [f"peers timed out after {timeout:g} s"], timeout)
        if proc.returncode != 0 or not response.exists():
            return PeerReport(
                [], {}, [f"peer runner failed (exit {proc.returncode})"], time.perf_counter() - started
            )
        answer = json.loads(response.read_text(encoding="utf-8"))
    cells: dict[tuple[str, str, int], Cell] = {}
    for row in answer["runs"]:
        key = (row["source"], row["method"], int(row["budget"]))
        cell = cells.setdefault(key, Cell(row["source"], row["method"], int(row["budget"])))
        if row.get("error"):
            cell.error = row["error"]
            continue
        cell.values.append([float(v) for v in row["values"]])
        cell.evaluations.append(int(row["distinct"]))
        cell.calls.append(int(row["calls"]))
        cell.seconds.append(float(row["seconds"]))
    versions = {str(k): str(v) for k, v in answer.get("versions", {}).items()}
    notes = [str(n) for n in answer.get("notes", [])]
    return PeerReport(list(cells.values()), versions, notes, time.perf_counter() - started)


# --------------------------------------------------------------------------- report


def fmt_error(x: float) -> str:
    return f"{x:.4f}"


def print_budget_table(budget: int, cells: Sequence[Cell], exact: FloatArray) -> None:
    mine = [c for c in cells if c.budget == budget]
    stats = {id(c): cell_stats(c, exact) for c in mine}
    peer_medians = [
        s.median_max_error for c in mine if c.source != "fedsv" and (s := stats[id(c)]) is not None
    ]
    best_peer = min(peer_medians) if peer_medians else None
    rows = []
    for c in mine:
        s = stats[id(c)]
        if s is None:
            rows.append([c.label, *["-"] * 7, f"failed: {(c.error or 'no runs')[:60]}"])
            continue
        ratio = "-" if best_peer is None or best_peer == 0 else f"{s.median_max_error / best_peer:.2f}x"
        calib = "-" if s.calibration is None else f"{s.calibration:.2f}"
        evals = f"{s.median_evaluations:g}"
        if s.max_evaluations > budget:
            evals += f" (max {s.max_evaluations})"
        rows.append(
            [
                c.label,
                fmt_error(s.median_max_error),
                ratio,
                fmt_error(s.p90_max_error),
                f"{s.mean_abs_bias:.5f}",
                calib,
                evals,
                f"{s.median_calls:g}",
                f"{s.median_seconds:.3f}" + (f" ({c.error[:40]})" if c.error else ""),
            ]
        )
    print(f"budget {budget} distinct utility evaluations\n")
    print_table(
        [
            "method",
            "median max err",
            "vs best peer",
            "p90 max err",
            "mean |bias|",
            "stderr calib",
            "evals (median)",
            "calls",
            "median s",
        ],
        rows,
    )
    cov_rows = []
    for c in mine:
        s = stats[id(c)]
        if s is not None:
            cov_rows.append([c.label, *(f"{s.coverage[f'{eps:g}']:.2f}" for eps in COVERAGE_EPS)])
    print(f"measured coverage at budget {budget}: fraction of seeds with max error <= eps\n")
    print_table(["method", *(f"eps {eps:g}" for eps in COVERAGE_EPS)], cov_rows)


def to_json(
    args: argparse.Namespace, table: RoundTable, cells: Sequence[Cell], peers: PeerReport | None
) -> dict[str, Any]:
    return {
        "command": f"python {shlex.join(sys.argv)}",
        "machine": machine(),
        "round": {
            "m": table.m,
            "seed": table.seed,
            "describe": table.describe,
            "table": str(table.path),
            "table_seconds": table.build_seconds,
            "utility_empty": float(table.utilities[0]),
            "utility_grand": float(table.utilities[-1]),
            "exact": [float(v) for v in table.exact],
        },
        "budgets": args.budgets,
        "seeds": args.seeds,
        "coverage_eps": list(COVERAGE_EPS),
        "peers": None
        if peers is None
        else {"versions": peers.versions, "notes": peers.notes, "seconds": peers.seconds},
        "cells": [
            {**asdict(c), "stats": None if (s := cell_stats(c, table.exact)) is None else asdict(s)}
            for c in cells
        ],
    }


# --------------------------------------------------------------------------- main


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--players", type=int, default=16, help="participants m of the round (default 16)")
    parser.add_argument(
        "--budgets", type=int_list, default=[500, 2000, 5000], help="comma-separated evaluation budgets"
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..S-1 per method and budget")
    parser.add_argument("--round-seed", type=int, default=0, help="seed of the round's training")
    parser.add_argument(
        "--methods", type=name_list, default=None, help="fedsv methods (default: all SAMPLING_METHODS)"
    )
    parser.add_argument("--no-peers", action="store_true", help="do not run shapiq / pyDVL")
    parser.add_argument(
        "--peer-methods",
        type=name_list,
        default=None,
        help="peer estimators by name, e.g. shapiq:KernelSHAP,pydvl:TMC (default: all)",
    )
    parser.add_argument("--peer-timeout", type=float, default=3600.0, help="seconds the peers may take")
    parser.add_argument("--table-only", action="store_true", help="build (or load) the table and stop")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, default=None, help="write all raw numbers to this JSON file")
    args = parser.parse_args(argv)
    if not 2 <= args.players <= 24:
        parser.error("--players must be in 2..24 (the table holds all 2^m utilities)")
    if args.seeds < 1 or not args.budgets or min(args.budgets) < 2:
        parser.error("need --seeds >= 1 and budgets >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"machine: {machine()}, {torch.get_num_threads()} torch threads")
    print(f"load average at start {load_average()}\n", flush=True)

    table = round_table(args.players, args.round_seed)
    how = "loaded from cache" if table.cached else "built"
    print(f"round: {table.describe}")
    print(
        f"table: {table.path.relative_to(HERE.parent)} ({how}); all {2**table.m} coalitions took "
        f"{table.build_seconds:.1f} s with RoundGame 'fast' on the CPU"
    )
    print(
        f"U(empty) = {table.utilities[0]:.4f}, U(all) = {table.utilities[-1]:.4f}, exact values in "
        f"[{table.exact.min():.4f}, {table.exact.max():.4f}], sum {table.exact.sum():.4f}\n",
        flush=True,
    )
    if args.table_only:
        return 0
    budgets = sorted(set(args.budgets))
    too_big = [b for b in budgets if b >= 2**table.m]
    if too_big:
        print(f"note: budgets {too_big} reach 2^m = {2**table.m}: every method can be exact there\n")

    from fedsv.valuation.estimators.spec import SAMPLING_METHODS

    methods = list(SAMPLING_METHODS) if args.methods is None else args.methods
    fedsv_started = time.perf_counter()
    cells = run_fedsv(table, methods, budgets, args.seeds)
    fedsv_seconds = time.perf_counter() - fedsv_started
    peers: PeerReport | None = None
    if not args.no_peers:
        print("peers (benchmarks/.peers-venv):", flush=True)
        peers = run_peers(table, budgets, args.seeds, args.peer_methods, args.peer_timeout)
        cells.extend(peers.cells)

    print(
        f"\nShapley estimators on the m={table.m} round, {args.seeds} seeds per cell, a fresh table game per "
        "run; max err = max_i |value_i - exact_i|; vs best peer = median max err / the best peer's; "
        "mean |bias| = mean over players of |mean over seeds of the signed error|; stderr calib = median "
        "reported stderr / std across seeds (1 = calibrated; fedsv only); evals = distinct coalitions "
        "evaluated (peers: counted by the table lookup); calls = utility calls including repeats "
        "(median; fedsv memoizes, so calls = evals)\n"
    )
    if peers is not None:
        print("peers: " + ", ".join(f"{k} {v}" for k, v in sorted(peers.versions.items())))
        for note in peers.notes:
            print(f"  {note}")
        print()
    for budget in budgets:
        print_budget_table(budget, cells, table.exact)
    print(
        f"fedsv: {fedsv_seconds:.1f} s"
        + ("" if peers is None else f"; peers: {peers.seconds:.1f} s")
        + f"; total {time.perf_counter() - started:.1f} s"
    )
    print(f"load average at end {load_average()} (other processes on the machine slow every timing)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(args, table, cells, peers), indent=1), encoding="utf-8")
        print(f"raw numbers: {args.json}")
    failed = [c.label for c in cells if c.source == "fedsv" and c.error]
    for label in failed:
        print(f"FAIL: fedsv {label} raised")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
