"""How often a round's accuracy utilities and values change under TF32 or BF16 instead of FP32.

Usage: python benchmarks/bench_precision.py [--device cpu|cuda[:N]|auto] [--players 10]

Builds a real round (the paper's MLP, 1,000 validation images, after one round of FedAvg), evaluates
all 2^m coalitions in each precision on the device, and prints per precision: the share of
coalitions whose utility changed, the images that flipped (median and max of 1,000), the largest
change of an exact Shapley value, and the seconds the 2^m evaluations took. On a CPU "tf32" is FP32
(TF32 is a CUDA tensor-core format); BF16 runs through autocast on both.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
from fixtures import train_round

from fedsv.data import load_dataset
from fedsv.fl.device import resolve_device
from fedsv.task.models import build_model
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import all_coalitions, shapley_from_table
from fedsv.valuation.round.device import PRECISIONS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--players", type=int, default=10)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"command: {' '.join(sys.argv)}\ndevice: {device} ({name}), torch {torch.__version__}")
    splits = load_dataset("embedded", seed=0, validation_size=1000)
    tr, va = splits.train, splits.validation
    rnd = train_round("mlp", tr.x, tr.y, va.x, va.y, args.players, seed=0)
    rows = all_coalitions(args.players)
    results: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for precision in PRECISIONS:
        model = build_model("mlp", rnd.input_shape)
        game = RoundGame(
            model,
            rnd.global_params,
            rnd.deltas,
            rnd.counts,
            rnd.x_val,
            rnd.y_val,
            device=device,
            precision=precision,
        )
        game.prepare()
        start = time.perf_counter()
        utilities = game.utilities(rows)
        results[precision] = (utilities, shapley_from_table(rows, utilities), time.perf_counter() - start)
    base_u, base_v, _ = results["fp32"]
    n = int(rnd.y_val.shape[0])
    print(f"{2**args.players} coalitions of a {args.players}-participant round, {n} validation images\n")
    header = ("precision", "seconds", "changed", "median flips", "max flips", "max |dvalue|")
    print("{:<10} {:>8} {:>8} {:>13} {:>10} {:>13}".format(*header))
    for precision, (u, v, seconds) in results.items():
        flips = np.rint(np.abs(u - base_u) * n)
        print(
            f"{precision:<10} {seconds:8.3f} {np.mean(flips > 0) * 100:7.1f}% {np.median(flips):13.1f} "
            f"{flips.max():10.0f} {np.abs(v - base_v).max():13.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
