"""What valuing one real round costs per model, and how close it gets: today's auto against the noise target.

Usage: python benchmarks/bench_round_cost.py [--cases mlp:10:1000,cnn:10:1000,...] [--fractions 0.5,1]
       [--seeds 1] [--resnet-train]

Each case (model:m:validation) trains a real round (the embedded MNIST sample, IID, FedAvg; CifarCNN
and the ResNet on the digits padded to 3x32x32) and values it with
fedsv.valuation.accounting.rounds.value_round,
a fresh game per run (the estimator, leave-one-out and the split by label and fold: what a round
costs). The runs, side by side:

- "exact": all 2^m coalitions (the reference; only where --exact allows), or beyond it "reference": a
  regression run of --reference coalitions (its own error is printed; it should be far below the
  others');
- "auto before": fedsv as it was before the noise target (commit 18e2e64, its tree given by
  --before-tree, run in a child process on the same round, side by side): exact when 2^m coalitions
  take at most 120 s at the measured cost, else regression to a standard error of 0.002 with doubling
  attempts. Without --before-tree, the same settings with today's code ("auto 0.002");
- "auto f=F": the noise target: exact outright only within 10 s, else regression until each value's
  standard error is at most F of its own validation noise, finishing exact at half the coalitions;
  the sampler corrected by the round's linearized model where its first attempt finds that it helps
  (surrogate.SurrogateCorrected);
- "f=F no surrogate": the same without the surrogate.

Per run: seconds, coalitions evaluated (forward passes over the validation set), the method that
ended, the largest |value - exact| and the largest |value - exact| / stated error, and the ratio of
seconds to "auto before" of the same case. --resnet-train also times one participant's local
training of the ResNet (5 epochs on 600 images, batch 32), the budget the issue sets its round's
valuation. Prints the machine and its load first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from fixtures import RealRound, load_average, machine, print_table, to_cifar_shape, train_round

from fedsv.data import load_dataset
from fedsv.fl.state import params_of
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation.accounting.rounds import RoundValues, value_round
from fedsv.valuation.estimators.api import measure_cost
from fedsv.valuation.estimators.spec import ValuationSpec

BEFORE = ValuationSpec(target_stderr=0.002, exact_seconds=120.0)
"""The run's valuation settings before the noise target (valuation_target_stderr 0.002, 120 s)."""

CIFAR_SHAPED = ("cnn_cifar", "resnet18")


@dataclass(frozen=True)
class Case:
    model: str
    m: int
    validation: int

    @classmethod
    def parse(cls, text: str) -> Case:
        model, m, validation = text.split(":")
        return cls(model, int(m), int(validation))


@dataclass(frozen=True)
class Run:
    label: str
    seconds: float
    method: str
    evaluations: int
    fedsv: np.ndarray
    stderr: np.ndarray
    choice: str = ""

    @classmethod
    def of(cls, label: str, seconds: float, values: RoundValues) -> Run:
        stderr = np.zeros(values.fedsv.shape) if values.stderr is None else values.stderr
        choice = getattr(values, "choice", "")  # fedsv before 6b7f841 records none
        return cls(label, seconds, values.method, values.evaluations, values.fedsv, stderr, choice)

    def to_json(self) -> str:
        data = {**dataclasses.asdict(self), "fedsv": self.fedsv.tolist(), "stderr": self.stderr.tolist()}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Run:
        data = json.loads(text)
        return cls(**{**data, "fedsv": np.asarray(data["fedsv"]), "stderr": np.asarray(data["stderr"])})


def real_round(case: Case, train_samples: int | None) -> RealRound:
    splits = load_dataset("embedded", seed=0, validation_size=case.validation)
    x, y = splits.train.x, splits.train.y
    xv = splits.validation.x
    if train_samples is not None:
        x, y = x[:train_samples], y[:train_samples]
    if case.model in CIFAR_SHAPED:
        x, xv = to_cifar_shape(x), to_cifar_shape(xv)
    return train_round(case.model, x, y, xv, splits.validation.y, case.m)


def value(rnd: RealRound, spec: ValuationSpec, label: str) -> Run:
    game = rnd.game()
    started = time.perf_counter()
    values = value_round(game, [f"p{i:02d}" for i in range(rnd.m)], 1, spec)
    return Run.of(label, time.perf_counter() - started, values)


def fingerprint(rnd: RealRound) -> float:
    """A checksum of w_t and the deltas: the child's round must be the parent's."""
    tensors = [*rnd.global_params.values(), *(t for d in rnd.deltas for t in d.values())]
    return float(sum(float(t.double().abs().sum()) for t in tensors if t.is_floating_point()))


def before_run(case: Case, seed: int, tree: str, train_samples: int | None, expect: float) -> Run:
    """ "auto before", valued by the fedsv in `tree` in a child process, on the same round."""
    command = [sys.executable, __file__, "--child", f"{case.model}:{case.m}:{case.validation}"]
    command += ["--seed", str(seed)] + (
        [] if train_samples is None else ["--train-samples", str(train_samples)]
    )
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    check, line = done.stdout.strip().splitlines()[-1].split(" ", 1)
    if float(check) != expect:
        raise SystemExit(f"the child trained another round ({check} != {expect}): not side by side")
    return Run.from_json(line)


def child(case: Case, seed: int, train_samples: int | None) -> int:
    """What --child prints: the round's fingerprint and "auto before"'s run, as JSON, on one line."""
    rnd = real_round(case, train_samples)
    run = value(rnd, BEFORE.with_seed(seed), "auto before")
    print(f"{fingerprint(rnd)!r} {run.to_json()}", flush=True)
    return 0


def specs(
    case: Case, fractions: list[float], exact: bool, reference: int, seed: int
) -> list[tuple[str, ValuationSpec]]:
    if exact:
        out = [("exact", ValuationSpec(method="exact"))]
    elif reference:  # beyond exact: a long regression run, its own stated error far below the others'
        out = [("reference", ValuationSpec(method="regression", budget=reference, seed=10_000))]
    else:
        out = []
    for f in fractions:
        spec = ValuationSpec(target_stderr=0.002, noise_fraction=f, exact_seconds=10.0, seed=seed)
        out.append((f"auto f={f:g}", spec))
        out.append((f"f={f:g} no surrogate", dataclasses.replace(spec, surrogate=False)))
    return out


def rows_of(case: Case, runs: list[Run], exact: np.ndarray | None) -> list[list[str]]:
    before = statistics.median(r.seconds for r in runs if r.label in ("auto before", "auto 0.002"))
    rows = []
    for r in runs:
        err = np.abs(r.fedsv - exact) if exact is not None else None
        stated = np.maximum(r.stderr, 1e-12)
        rows.append([
            f"{case.model} m={case.m} n={case.validation}",
            r.label,
            r.method,
            f"{r.seconds:.1f}",
            str(r.evaluations),
            "-" if err is None else f"{err.max():.4f}",
            "-" if err is None or r.label in ("exact", "reference") or r.method == "exact"
            else f"{(err / stated).max():.1f}",
            f"{r.stderr.max():.4f}",
            f"{before / r.seconds:.2f}x",
        ])  # fmt: skip
    return rows


def resnet_training_seconds() -> float:
    """One participant's local training of the ResNet: 5 epochs on 600 images, batch 32."""
    splits = load_dataset("embedded", seed=0)
    x, y = to_cifar_shape(splits.train.x[:600]), splits.train.y[:600]
    model = build_model("resnet18", (3, 32, 32), seed=0)
    params = params_of(model)
    started = time.perf_counter()
    local_update(model, params, x, y, TrainConfig(epochs=5, batch_size=32, lr=0.05), seed=0)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mlp:10:1000,cnn:10:1000,cnn_cifar:10:500,mlp:20:1000,cnn:20:1000")
    parser.add_argument("--fractions", default="0.5,1")
    parser.add_argument("--seeds", type=int, default=1, help="sampler seeds per sampled run")
    parser.add_argument("--exact", type=int, default=10, help="run the exact reference up to this m")
    parser.add_argument(
        "--reference",
        type=int,
        default=0,
        help="beyond --exact, a regression run with this many coalitions as the reference",
    )
    parser.add_argument("--train-samples", type=int, default=None, help="train the round on fewer images")
    parser.add_argument("--resnet-train", action="store_true")
    parser.add_argument("--before-tree", default=None, help="a folder holding fedsv as of commit 18e2e64")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.child:
        return child(Case.parse(args.child), args.seed, args.train_samples)
    print(f"machine: {machine()}; load {load_average()}", flush=True)
    fractions = [float(f) for f in args.fractions.split(",") if f]
    header = ["case", "run", "ended", "s", "coalitions", "max err", "max err/stated", "max stated",
              "speed vs before"]  # fmt: skip
    table: list[list[str]] = []
    for case in map(Case.parse, filter(None, args.cases.split(","))):
        rnd = real_round(case, args.train_samples)
        runs: list[Run] = []
        exact = None
        for seed in range(args.seeds):
            first = seed == 0
            if args.before_tree:
                run = before_run(case, seed, args.before_tree, args.train_samples, fingerprint(rnd))
                runs.append(run)
                print(f"  {case} auto before seed {seed} (18e2e64): {run.method}, {run.evaluations} "
                      f"coalitions, {run.seconds:.1f} s", flush=True)  # fmt: skip
            named = specs(case, fractions, case.m <= args.exact and first, args.reference * first, seed)
            if not args.before_tree:
                named.insert(len(named) - len(fractions), ("auto 0.002", BEFORE.with_seed(seed)))
            for label, spec in named:
                run = value(rnd, spec, label)
                runs.append(run)
                if label in ("exact", "reference"):
                    exact = run.fedsv
                print(f"  {case} {label} seed {seed}: {run.method}, {run.evaluations} "
                      f"coalitions, {run.seconds:.1f} s; {run.choice}", flush=True)  # fmt: skip
        rows = rows_of(case, runs, exact)
        print_table(header, rows)
        table.extend(rows)
    if table:
        print(f"all cases (load {load_average()}):")
        print_table(header, table)
    if args.resnet_train:
        print(
            f"ResNet-18 local training, 5 epochs on 600 images: {resnet_training_seconds():.1f} s", flush=True
        )
        from fedsv.valuation.estimators.target import first_allowance  # not in fedsv before 6b7f841

        rnd = real_round(Case("resnet18", 10, 100), 600)
        cost = measure_cost(rnd.game())
        print(f"ResNet-18 m=10, 100 validation images: {cost:.2f} s per coalition; a sampler's first attempt "
              f"({first_allowance(10)} coalitions) {cost * first_allowance(10):.0f} s, exact "
              f"{cost * 2**10:.0f} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
