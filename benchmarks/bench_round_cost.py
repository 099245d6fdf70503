"""What valuing one real round costs per model, and how close `auto` gets to the exact values.

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
- "auto f=F": the noise target: exact outright only within 10 s, else regression until each value's
  standard error is at most F of its own validation noise, finishing exact at half the coalitions;
  the sampler corrected by the round's linearized model where its first attempt finds that it helps
  (surrogate.SurrogateCorrected);
- "f=F no surrogate": the same without the surrogate.

Per run: seconds, coalitions evaluated (forward passes over the validation set), the method that
ended, the largest |value - exact| and the largest |value - exact| / stated error, and the run's speed
against exact (or the reference) of the same case. --resnet-train also times one participant's local
training of the ResNet (5 epochs on 600 images, batch 32), the budget the issue sets its round's
valuation. Prints the machine and its load first.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
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
        return cls(label, seconds, values.method, values.evaluations, values.fedsv, stderr, values.choice)


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
    timed = [r.seconds for r in runs if r.label in ("exact", "reference")]
    reference = statistics.median(timed) if timed else None
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
            "-" if reference is None else f"{reference / r.seconds:.2f}x",
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
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    print(f"machine: {machine()}; load {load_average()}", flush=True)
    fractions = [float(f) for f in args.fractions.split(",") if f]
    header = ["case", "run", "ended", "s", "coalitions", "max err", "max err/stated", "max stated",
              "speed vs exact"]  # fmt: skip
    table: list[list[str]] = []
    for case in map(Case.parse, filter(None, args.cases.split(","))):
        rnd = real_round(case, args.train_samples)
        runs: list[Run] = []
        exact = None
        for seed in range(args.seeds):
            first = seed == 0
            named = specs(case, fractions, case.m <= args.exact and first, args.reference * first, seed)
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
        from fedsv.valuation.estimators.target import first_allowance

        rnd = real_round(Case("resnet18", 10, 100), 600)
        cost = measure_cost(rnd.game())
        print(f"ResNet-18 m=10, 100 validation images: {cost:.2f} s per coalition; a sampler's first attempt "
              f"({first_allowance(10)} coalitions) {cost * first_allowance(10):.0f} s, exact "
              f"{cost * 2**10:.0f} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
