"""In-process FedAvg on the embedded data, valuing every round with the federated SV (the demo)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedsv.common.corruptions import parse_corruption
from fedsv.common.data import load_dataset
from fedsv.common.models import build_model
from fedsv.common.shards import load_shard
from fedsv.common.training import TrainConfig, apply_delta, evaluate, fedavg, local_update, params_of
from fedsv.valuation import FederatedValuation, RoundGame, RoundValues

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig:
    """Settings of a demo run; every field is also a command-line flag."""

    participants: int = field(default=20, metadata={"help": "number of participants N"})
    fraction: float = field(default=0.5, metadata={"help": "fraction C selected per round"})
    rounds: int = field(default=5, metadata={"help": "training rounds T"})
    seed: int = field(default=0, metadata={"help": "seed of data split, partition, selection, training"})
    dataset: str = field(default="embedded", metadata={"help": "embedded | mnist | fashion_mnist | cifar10"})
    data_dir: str = field(default="", metadata={"help": "directory with the dataset files"})
    model: str = field(default="mlp", metadata={"help": "mlp | cnn"})
    partition: str = field(default="iid", metadata={"help": "iid | noniid"})
    valuation: str = field(default="auto", metadata={"help": "auto | exact | permutation | group_testing"})
    eps: float = field(default=0.05, metadata={"help": "valuation accuracy epsilon"})
    delta: float = field(default=0.05, metadata={"help": "valuation failure probability delta"})
    epochs: int = field(default=5, metadata={"help": "local epochs"})
    batch_size: int = field(default=10, metadata={"help": "local batch size"})
    lr: float = field(default=0.05, metadata={"help": "local learning rate"})
    validation_size: int = field(default=1000, metadata={"help": "validation samples used for the utility"})
    noisy: int = field(default=0, metadata={"help": "the first K ranks train on corrupted data"})
    corruption: str = field(default="flip:0.5", metadata={"help": "corruption of the noisy ranks"})

    def __post_init__(self) -> None:
        if self.participants < 1:
            raise ValueError(f"--participants must be at least 1, got {self.participants}")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"--fraction must be in (0, 1], got {self.fraction}")
        if self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")
        if not 0 <= self.noisy <= self.participants:
            raise ValueError(f"--noisy must be between 0 and --participants, got {self.noisy}")
        parse_corruption(self.corruption)

    @property
    def selected_per_round(self) -> int:
        return max(1, round(self.fraction * self.participants))


@dataclass
class DemoResult:
    """What a demo run produced: per-round values, accuracies, and the accounting object."""

    valuation: FederatedValuation
    accuracies: list[float]
    noisy_ids: list[str]


def run_demo(config: DemoConfig, on_round: Callable[[RoundValues, float], None] | None = None) -> DemoResult:
    """Train T rounds of FedAvg in this process and value every round's deltas with the federated SV."""
    splits = load_dataset(
        config.dataset, config.data_dir or None, seed=config.seed, validation_size=config.validation_size
    )
    model = build_model(config.model, splits.input_shape, splits.num_classes, seed=config.seed)
    global_params = params_of(model)
    train_config = TrainConfig(epochs=config.epochs, batch_size=config.batch_size, lr=config.lr)
    shards, corruptions = [], []
    for rank in range(config.participants):
        spec = config.corruption if rank < config.noisy else "none"
        shard, corruption = load_shard(splits, rank, config.participants, config.partition, config.seed, spec)
        shards.append(shard)
        corruptions.append(corruption)
    ids = [f"p{rank:03d}" for rank in range(config.participants)]
    rng = np.random.default_rng(config.seed)
    ledger = FederatedValuation()
    accuracies: list[float] = []
    x_val, y_val = torch.from_numpy(splits.validation.x), torch.from_numpy(splits.validation.y)
    for t in range(1, config.rounds + 1):
        selected = sorted(
            rng.choice(config.participants, size=config.selected_per_round, replace=False).tolist()
        )
        deltas = [
            local_update(
                model,
                global_params,
                shards[r].x,
                shards[r].y,
                train_config,
                seed=config.seed * 1_000_003 + t * 1009 + r,
                corruption=corruptions[r],
            )
            for r in selected
        ]
        counts = [len(shards[r]) for r in selected]
        game = RoundGame(model, global_params, deltas, counts, x_val, y_val)
        values = ledger.value_round(
            game,
            [ids[r] for r in selected],
            t,
            method=config.valuation,
            eps=config.eps,
            delta=config.delta,
            seed=config.seed + t,
        )
        global_params = apply_delta(global_params, fedavg(deltas, counts))
        accuracy, _ = evaluate(model, global_params, splits.test.x, splits.test.y)
        accuracies.append(accuracy)
        if on_round is not None:
            on_round(values, accuracy)
    noisy_ids = ids[: config.noisy]
    return DemoResult(ledger, accuracies, noisy_ids)


def format_round(values: RoundValues, accuracy: float) -> str:
    return (
        f"round {values.round:3d}  selected {len(values.participants):3d}  test acc {accuracy:6.3f}  "
        f"U {values.utility_before:.3f} -> {values.utility_after:.3f}  {values.method:>13s}  "
        f"{values.evaluations:6d} evals  {values.seconds:6.2f} s  "
        f"residual {values.group_rationality_residual:+.1e}"
    )


def format_table(result: DemoResult) -> str:
    """Participants ranked by FedSV (highest first) with the normalized and LOO values."""
    totals = result.valuation.totals()
    ids = sorted(totals["fedsv"], key=lambda p: -totals["fedsv"][p])
    rounds_in = {p: 0 for p in ids}
    for rv in result.valuation.per_round():
        for p in rv.participants:
            rounds_in[p] += 1
    lines = [
        f"{'rank':>4s}  {'participant':<11s} {'rounds':>6s} {'FedSV':>9s} {'FedSV norm':>10s} "
        f"{'LOO':>9s} {'LOO norm':>9s}"
    ]
    for position, p in enumerate(ids, start=1):
        mark = "  (corrupted)" if p in result.noisy_ids else ""
        lines.append(
            f"{position:4d}  {p:<11s} {rounds_in[p]:6d} {totals['fedsv'][p]:9.4f} "
            f"{totals['fedsv_normalized'][p]:10.4f} {totals['loo'][p]:9.4f} "
            f"{totals['loo_normalized'][p]:9.4f}{mark}"
        )
    return "\n".join(lines)


def main_demo(config: DemoConfig) -> int:
    started = time.perf_counter()
    print(
        f"fedsv demo: {config.participants} participants, {config.selected_per_round} per round, "
        f"{config.rounds} rounds, {config.model} on {config.dataset} ({config.partition}), "
        f"valuation={config.valuation}"
    )
    result = run_demo(config, on_round=lambda v, a: print(format_round(v, a), flush=True))
    print()
    print(format_table(result))
    print(f"\nfinal test accuracy {result.accuracies[-1]:.3f}; {time.perf_counter() - started:.1f} s in all")
    return 0
