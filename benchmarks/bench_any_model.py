"""Exact FedSV of a round of Flower's quickstart-pytorch `Net`: the traced fast path against the batched mode.

Usage: python benchmarks/bench_any_model.py [--players 8] [--validation 1000] [--repeats 3]

`Net` is Flower's own (examples/quickstart-pytorch, its forward unchanged: F.relu, a shared MaxPool2d,
x.view(-1, 400)); it is not an nn.Sequential, so before torch.fx tracing a round game evaluated it by
vmap over the whole model ("batched"). The round is real: the embedded MNIST sample padded to
3x32x32 (as Flower's CIFAR-10 input), an IID split, one round of FedAvg, then the second round's
deltas are valued exactly (all 2^m coalitions) on the validation images in each mode. Prints per mode
the median seconds over --repeats fresh games, coalitions per second, the speed-up over "batched",
and the largest difference of any Shapley value from "batched".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from fixtures import TRAIN_CONFIG, load_average, machine, print_table, to_cifar_shape
from torch import Tensor, nn

from fedsv.data import load_dataset
from fedsv.data.partition import partition_indices
from fedsv.fl.state import apply_delta, fedavg, params_of
from fedsv.task.training import local_update
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import all_coalitions, shapley_from_table


class Net(nn.Module):
    """Flower's examples/quickstart-pytorch/pytorchexample/task.py Net, verbatim."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def real_round(
    players: int, validation: int
) -> tuple[Net, dict[str, Tensor], list[dict[str, Tensor]], list[int], Tensor, Tensor]:
    """w_t after one FedAvg round of `Net` and the next round's deltas, on padded MNIST."""
    splits = load_dataset("embedded", seed=0, validation_size=validation)
    x_train, y_train = to_cifar_shape(splits.train.x), splits.train.y
    torch.manual_seed(0)
    model = Net()
    global_params = params_of(model)
    parts = partition_indices(y_train, players, "iid", 0)
    counts = [len(p) for p in parts]
    deltas: list[dict[str, Tensor]] = []
    for t in range(2):
        if t:
            global_params = apply_delta(global_params, fedavg(deltas, counts))
        deltas = [
            local_update(model, global_params, x_train[p], y_train[p], TRAIN_CONFIG, seed=1000 * t + i)
            for i, p in enumerate(parts)
        ]
    x_val = torch.from_numpy(to_cifar_shape(splits.validation.x))
    return model, global_params, deltas, counts, x_val, torch.from_numpy(splits.validation.y)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--players", type=int, default=8)
    parser.add_argument("--validation", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="fast,batched")
    args = parser.parse_args(argv)
    print(f"command: {' '.join(sys.argv)}\nmachine: {machine()}\nload before: {load_average()}")
    model, g, deltas, counts, x_val, y_val = real_round(args.players, args.validation)
    m = args.players
    members = all_coalitions(m)
    timings: dict[str, list[float]] = {}
    values: dict[str, np.ndarray] = {}
    how: dict[str, str] = {}
    for mode in args.modes.split(","):
        for _ in range(args.repeats):
            start = time.perf_counter()
            game = RoundGame(model, g, deltas, counts, x_val, y_val, mode=mode)
            table = game.utilities(members)
            timings.setdefault(mode, []).append(time.perf_counter() - start)
        values[mode] = shapley_from_table(members, table)
        how[mode] = game.mode
    reference = values.get("batched", next(iter(values.values())))
    base = statistics.median(timings.get("batched", next(iter(timings.values()))))
    rows = []
    for mode, seconds in timings.items():
        median = statistics.median(seconds)
        rows.append(
            [
                mode,
                how[mode],
                f"{median:.2f}",
                f"{2**m / median:.0f}",
                f"{base / median:.2f}x",
                f"{float(np.max(np.abs(values[mode] - reference))):.1e}",
            ]
        )
    print(f"\nFlower quickstart Net, m = {m}, {2**m} coalitions, {args.validation} validation images, exact")
    header = ["requested", "ran as", "median s", "coalitions/s", "speed-up", "largest value diff"]
    print_table(header, rows)
    print(f"load after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
