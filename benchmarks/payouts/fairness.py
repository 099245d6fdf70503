"""Does completing the values remove selection luck? Twins, and a full-participation reference.

Usage: python benchmarks/bench_payouts.py --part fairness [--seeds 5] [--rounds 10]

Members differ in quality: each holds an IID shard of 150 images of the embedded MNIST sample, and
member k of n has a fraction 0.8·k/(n-1) of its labels replaced by random ones (so true values fall
with k, and a ranking has something to find).

1. Twins. 20 members, 10 selected per round: members 17, 18 and 19 hold exact copies (images and
   noisy labels) of the shards of members 0, 8 and 16 (17 distinct shards). Every round is valued
   exactly. For each twin pair, the gap between the twins' totals relative to the spread of all
   members' totals (their standard deviation), under FedSV and under the completed values, per seed.
2. Full participation. 10 members, each training every round, so each round's 10-player values can be
   computed (exact) as the reference. Selection is then emulated for the valuation only: each round a
   random 5 of the 10 are "selected", and valued by the exact values of that round's game restricted
   to them, as a run that selected them would. How close each variant's totals come to the reference:
   Kendall's tau of the rankings, and the share of a pot paid out by value (negative values paid
   nothing) that goes to the wrong members (half the L1 distance between the payout shares).
3. Cost. The completion's wall time at the paper's scale (100 members, 10 selected per round, 25
   rounds) and at 100 rounds, on round values of a quality-times-gain shape plus noise (median of 5).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from fixtures import print_table

from fedsv.data import load_dataset
from fedsv.data.partition import partition_indices
from fedsv.fl.aggregation import aggregate
from fedsv.fl.state import params_of
from fedsv.fl.updates import ClientUpdate
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation import FederatedValuation, RoundGame, RoundValues, ValuationSpec
from fedsv.valuation.accounting.completion import complete
from fedsv.valuation.estimators.exact import shapley_from_dense
from fedsv.valuation.games.game import bitmasks
from payouts.targets import Target

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.05)


def misallocated(values: np.ndarray, reference: np.ndarray) -> float:
    """The share of a pot paid by `values` instead of by `reference` that goes to the wrong members."""
    shares = [np.maximum(v, 0.0) / max(float(np.maximum(v, 0.0).sum()), 1e-300) for v in (values, reference)]
    return float(np.abs(shares[0] - shares[1]).sum() / 2)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    n, agree = len(a), 0.0
    for i in range(n):
        for j in range(i + 1, n):
            agree += np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])
    return float(agree / (n * (n - 1) / 2))


def noisy_shards(y: np.ndarray, n: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """n disjoint IID shards of 150 and the labels with shard k's fraction 0.8·k/(n-1) randomised."""
    rng = np.random.default_rng(seed + 7)
    shards = [part[:150] for part in partition_indices(y, n, "iid", seed)]
    noisy = y.copy()
    for k, shard in enumerate(shards):
        flip = shard[rng.random(len(shard)) < 0.8 * k / (n - 1)]
        noisy[flip] = rng.integers(0, 10, size=len(flip))
    return shards, noisy


class Federation:
    """Members with their shards (indices into the training split), trained with seeded FedAvg."""

    def __init__(self, shards: list[np.ndarray], labels: np.ndarray, seed: int) -> None:
        splits = load_dataset("embedded", seed=0)
        self.x, self.y = splits.train.x, labels
        self.x_val, self.y_val = splits.validation.x, splits.validation.y
        self.shards, self.seed = shards, seed
        self.model = build_model("mlp", (1, 28, 28), seed=seed)
        self.params = params_of(self.model)

    def train(self, t: int, members: list[int]) -> list[ClientUpdate]:
        return [
            ClientUpdate(
                f"p{i:03d}",
                local_update(self.model, self.params, self.x[self.shards[i]], self.y[self.shards[i]], TRAIN,
                             seed=self.seed * 1_000_003 + t * 1009 + i),
                len(self.shards[i]),
            )
            for i in members
        ]  # fmt: skip

    def game(self, updates: list[ClientUpdate]) -> RoundGame:
        return RoundGame(
            self.model, self.params, [u.delta for u in updates], [u.num_samples for u in updates],
            torch.from_numpy(self.x_val), torch.from_numpy(self.y_val),
        )  # fmt: skip

    def step(self, t: int, updates: list[ClientUpdate]) -> None:
        self.params = aggregate(self.params, updates, t)


def twins(seed: int, rounds: int) -> tuple[float, float]:
    """The mean twin gap relative to the spread of totals, under FedSV and the completed values."""
    distinct, labels = noisy_shards(load_dataset("embedded", seed=0).train.y, 17, seed)
    shards = [*distinct, distinct[0], distinct[8], distinct[16]]  # 17, 18, 19 copy 0, 8, 16
    fed = Federation(shards, labels, seed)
    world = [f"p{i:03d}" for i in range(20)]
    accounting = FederatedValuation(world)
    rng = np.random.default_rng(seed)
    for t in range(1, rounds + 1):
        members = sorted(int(i) for i in rng.choice(20, size=10, replace=False))
        updates = fed.train(t, members)
        accounting.value_round(
            fed.game(updates), [u.participant for u in updates], t, ValuationSpec(method="exact")
        )
        fed.step(t, updates)
    totals = accounting.totals()
    gaps = []
    for key in ("fedsv", "fedsv_completed"):
        values = np.array([totals[key].get(pid, 0.0) for pid in world])
        spread = float(values.std())
        gaps.append(
            float(np.mean([abs(values[a] - values[b]) for a, b in ((0, 17), (8, 18), (16, 19))])) / spread
        )
    return gaps[0], gaps[1]


def full_participation(seed: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Kendall's tau and the misallocated share against the full-participation values, per variant."""
    shards, labels = noisy_shards(load_dataset("embedded", seed=0).train.y, 10, seed)
    fed = Federation(shards, labels, seed)
    ids = [f"p{i:03d}" for i in range(10)]
    reference = np.zeros(10)
    selected_only = FederatedValuation(ids)
    rng = np.random.default_rng(seed + 100)
    for t in range(1, rounds + 1):
        updates = fed.train(t, list(range(10)))
        game = fed.game(updates)
        full = FederatedValuation().value_round(game, ids, t, ValuationSpec(method="exact"))
        reference += full.fedsv
        table = game.dense_table()
        assert table is not None
        chosen = sorted(int(i) for i in rng.choice(10, size=5, replace=False))
        members = np.zeros((32, 10), dtype=bool)
        for mask in range(32):
            members[mask, [chosen[k] for k in range(5) if mask >> k & 1]] = True
        sub = table[bitmasks(members)]
        assert not np.isnan(sub).any(), "the exact valuation filled the dense table"
        values = shapley_from_dense(sub)
        selected_only.add_round(
            RoundValues(t, [ids[i] for i in chosen], values, np.zeros(5), float(sub[0]), float(sub[-1]),
                        "exact", 32, 0.0, np.zeros(5))
        )  # fmt: skip
        fed.step(t, updates)
    totals = selected_only.totals()
    spread = float(reference.std())
    out = {}
    for key in ("fedsv", "fedsv_completed"):
        values = np.array([totals[key].get(pid, 0.0) for pid in ids])
        out[key] = (
            kendall_tau(values, reference),
            float(np.sqrt(np.mean((values - reference) ** 2))) / spread,
        )
    return out


def completion_seconds(rounds: int, members: int = 100, selected: int = 10) -> tuple[float, str]:
    """Median wall time of complete() on a (rounds, members) matrix, and the model it chose."""
    rng = np.random.default_rng(0)
    values = np.outer(0.05 * np.exp(-np.arange(rounds) / 6), rng.normal(1.0, 0.5, members))
    values += rng.normal(0.0, 0.002, values.shape)
    mask = np.zeros(values.shape, dtype=bool)
    for row in mask:
        row[rng.choice(members, selected, replace=False)] = True
    times, model = [], ""
    for _ in range(5):
        started = time.perf_counter()
        model = complete(values, mask, np.zeros_like(values), [selected] * rounds, members).model
        times.append(time.perf_counter() - started)
    return statistics.median(times), model


def run(seeds: int, rounds: int) -> list[Target]:
    """Print the three tables; the targets: the completed values' twin gap and misallocated share below
    FedSV's (medians over seeds)."""
    twin_rows, gaps = [], {"fedsv": list[float](), "fedsv_completed": list[float]()}
    for seed in range(seeds):
        fedsv, completed = twins(seed, rounds)
        gaps["fedsv"].append(fedsv)
        gaps["fedsv_completed"].append(completed)
        twin_rows.append([str(seed), f"{fedsv:.3f}", f"{completed:.3f}"])
        print(f"  twins, seed {seed} done", flush=True)
    gap = {key: statistics.median(values) for key, values in gaps.items()}
    twin_rows.append(["median", f"{gap['fedsv']:.3f}", f"{gap['fedsv_completed']:.3f}"])
    full_rows, scores = (
        [],
        {"fedsv": list[tuple[float, float]](), "fedsv_completed": list[tuple[float, float]]()},
    )
    for seed in range(seeds):
        result = full_participation(seed, rounds)
        for key in scores:
            scores[key].append(result[key])
        full_rows.append([str(seed), *(f"{result[k][0]:.3f} / {result[k][1]:.3f}" for k in scores)])
        print(f"  full participation, seed {seed} done", flush=True)
    medians = {
        k: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v)) for k, v in scores.items()
    }
    full_rows.append(["median", *(f"{medians[k][0]:.3f} / {medians[k][1]:.3f}" for k in scores)])
    print(
        "\n1. Twins (20 members, 3 twin pairs, 10 selected per round, exact values): mean twin gap / spread\n"
    )
    print_table(["seed", "FedSV", "completed"], twin_rows)
    print("2. Full participation (10 members; 5 'selected' per round for the valuation): "
          "Kendall's tau / share of a pot misallocated\n")  # fmt: skip
    print_table(["seed", "FedSV", "completed"], full_rows)
    cost_rows = []
    for size in (25, 100):
        seconds, model = completion_seconds(size)
        cost_rows.append([f"{size} x 100, 10 selected", f"{seconds:.3f}", model])
    print("3. Cost of a completion (run by the valuation process whenever it has caught up)\n")
    print_table(["rounds x members", "seconds (median of 5)", "model chosen"], cost_rows)
    twin, wrong = (gap["fedsv_completed"], gap["fedsv"]), (medians["fedsv_completed"][1], medians["fedsv"][1])
    return [
        Target("fairness", "twins: the completed values' gap / spread below FedSV's",
               f"{twin[0]:.3f} against {twin[1]:.3f}", twin[0] < twin[1]),
        Target("fairness", "against full participation: the completed values misallocate less than FedSV",
               f"{wrong[0]:.3f} against {wrong[1]:.3f}", wrong[0] < wrong[1]),
    ]  # fmt: skip
