"""What the benchmarks share: a real round of FedAvg training to value, the machine's name, tables."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedsv.data.partition import partition_indices
from fedsv.fl.state import apply_delta, fedavg, params_of
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.result import ValuationResult

TRAIN_CONFIG = TrainConfig(epochs=1, batch_size=10, lr=0.05)
"""Local training of every participant: one epoch of plain SGD (the demo's batch size and learning rate)."""

TRAIN_ROUNDS = 2
"""FedAvg rounds trained; the benchmark values the last one (w_t after round 1, the deltas of round 2)."""


@dataclass
class RealRound:
    """A round of real FedAvg training: w_t, the participants' deltas and their sample counts."""

    model_name: str
    input_shape: tuple[int, int, int]
    global_params: dict[str, Tensor]
    deltas: list[dict[str, Tensor]]
    counts: list[int]
    x_val: Tensor
    y_val: Tensor
    describe: str
    device: str = "cpu"
    precision: str = "fp32"

    @property
    def m(self) -> int:
        return len(self.deltas)

    def game(self, mode: str = "fast", num_val: int | None = None, m: int | None = None) -> RoundGame:
        """A fresh (empty-cache) round game over the first num_val validation samples and first m deltas."""
        n = self.x_val.shape[0] if num_val is None else num_val
        k = self.m if m is None else m
        model = build_model(self.model_name, self.input_shape)
        return RoundGame(
            model,
            self.global_params,
            self.deltas[:k],
            self.counts[:k],
            self.x_val[:n],
            self.y_val[:n],
            mode=mode,
            device=self.device,
            precision=self.precision,
        )


def train_round(
    model_name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    participants: int,
    seed: int = 0,
    rounds: int = TRAIN_ROUNDS,
) -> RealRound:
    """`rounds` rounds of FedAvg over an IID partition; returns the last round's inputs."""
    input_shape = (int(x_train.shape[1]), int(x_train.shape[2]), int(x_train.shape[3]))
    model = build_model(model_name, input_shape, seed=seed)
    global_params = params_of(model)
    parts = partition_indices(y_train, participants, "iid", seed)
    counts = [len(p) for p in parts]
    deltas: list[dict[str, Tensor]] = []
    for t in range(rounds):
        if t > 0:
            global_params = apply_delta(global_params, fedavg(deltas, counts))
        deltas = [
            local_update(model, global_params, x_train[p], y_train[p], TRAIN_CONFIG, seed=1000 * t + i)
            for i, p in enumerate(parts)
        ]
    describe = (
        f"{model_name}: {participants} IID participants x {counts[0]} samples, round {rounds} of "
        f"FedAvg (local: {TRAIN_CONFIG.epochs} epoch, batch {TRAIN_CONFIG.batch_size}, lr {TRAIN_CONFIG.lr})"
    )
    return RealRound(
        model_name,
        input_shape,
        global_params,
        deltas,
        counts,
        torch.from_numpy(x_val),
        torch.from_numpy(y_val),
        describe,
    )


def to_cifar_shape(x: np.ndarray) -> np.ndarray:
    """1x28x28 digits -> 3x32x32 images (zero-padded by 2 pixels, gray replicated to 3 channels)."""
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    return np.ascontiguousarray(np.repeat(padded, 3, axis=1), dtype=np.float32)


def timed(run: Callable[[], ValuationResult]) -> tuple[float, ValuationResult]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> str:
    """The 1/5/15-minute load averages, or "n/a" where the OS has none."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table, columns padded to their widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |")
    print(flush=True)


def machine() -> str:
    """The CPU, its count, and the Python and torch versions: every table names the machine."""
    return (
        f"{cpu_model()} ({platform.processor() or platform.machine()}), {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, torch {torch.__version__}, {platform.system()}"
    )
