"""One round's pure step once its updates are in (FedAvg, valuation, accounting), and its seeded draws.

`fedsv demo` (in one process) and the coordinator's round loop (over gRPC) both call these, so the two
cannot drift: the same seed gives the same selections, local-training seeds, models and values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.common.training import apply_delta, fedavg
from fedsv.valuation import FederatedValuation, RoundGame, RoundValues, ValuationSpec
from fedsv.valuation.aggregation import AggregationRule, pairwise_distances
from fedsv.valuation.api import Plan

Metric = str | Callable[[Tensor, Tensor], Tensor]
"""A validation metric: "accuracy", "neg_loss", or (logits, y) -> per-sample scores."""


FEDAVG = AggregationRule()


@dataclass(frozen=True)
class GameSettings:
    """How a round's game computes: its validation metric, the torch device ("auto": CUDA when
    present), the precision ("fp32", "tf32", "bf16"; see fedsv.valuation.RoundGame), and the
    aggregation rule, which the coordinator applies to the round and the game to every coalition."""

    metric: Metric = "accuracy"
    device: str = "cpu"
    precision: str = "fp32"
    aggregation: AggregationRule = field(default_factory=AggregationRule)


@dataclass(frozen=True)
class ClientUpdate:
    """What one participant contributed to a round: its delta (trained - w_t) and its sample count."""

    participant: str
    delta: Mapping[str, Tensor]
    num_samples: int


@dataclass(frozen=True)
class EvalSet:
    """Images and labels a model is scored on (the coordinator's validation or test split)."""

    x: np.ndarray | Tensor
    y: np.ndarray | Tensor


@dataclass(frozen=True)
class RoundOutcome:
    """w_{t+1}, the round's values (method "none": zeros, utilities only) and how long each part took."""

    params: dict[str, Tensor]
    values: RoundValues
    aggregation_seconds: float
    valuation_seconds: float


def train_seed(seed: int, round_number: int, rank: int) -> int:
    """The seed of a rank's local training in a round (the coordinator sends it with the task)."""
    return seed * 1_000_003 + round_number * 1009 + rank


def select_ranks(
    rng: np.random.Generator, participants: int, per_round: int, fixed: Sequence[int] | None = None
) -> list[int]:
    """The round's selected ranks: a seeded draw of `per_round` of `participants`, sorted.

    The draw is made even when a `fixed` selection replaces it, so a run that replays some rounds'
    selections keeps the same random stream as the run it replays.
    """
    drawn = sorted(int(r) for r in rng.choice(participants, size=per_round, replace=False))
    return sorted(fixed) if fixed is not None else drawn


def _ordered(updates: Sequence[ClientUpdate], number: int) -> list[ClientUpdate]:
    """The updates in participant-id order, whatever order they arrived in."""
    if not updates:
        raise ValueError(f"round {number}: no updates to aggregate")
    return sorted(updates, key=lambda u: u.participant)


def aggregate(
    params: Mapping[str, Tensor],
    updates: Sequence[ClientUpdate],
    number: int,
    rule: AggregationRule = FEDAVG,
) -> dict[str, Tensor]:
    """w_{t+1} = w_t + the rule's aggregate of the round's updates (FedAvg: weighted by sample counts)."""
    ordered = _ordered(updates, number)
    counts = [u.num_samples for u in ordered]
    if rule.name == "fedavg":
        return apply_delta(params, fedavg([u.delta for u in ordered], counts))
    return apply_delta(params, robust_aggregate(rule, [u.delta for u in ordered], counts))


def robust_aggregate(
    rule: AggregationRule, deltas: Sequence[Mapping[str, Tensor]], counts: Sequence[int]
) -> dict[str, Tensor]:
    """The rule's aggregate of all the deltas, computed in float64 as the round game computes a coalition."""
    names = list(deltas[0])
    matrices = {n: torch.stack([d[n].reshape(-1).to(torch.float64) for d in deltas]) for n in names}
    everyone = torch.ones((1, len(deltas)), dtype=torch.bool)
    if rule.coordinatewise:
        flat = {n: rule.combine(everyone, matrix)[0] for n, matrix in matrices.items()}
    else:
        distances = pairwise_distances(list(matrices.values())) if rule.selects else None
        weights = torch.tensor([float(c) for c in counts], dtype=torch.float64)
        coeffs = rule.coefficients(everyone, weights, distances)
        flat = {n: (coeffs @ matrix)[0] for n, matrix in matrices.items()}
    return {n: flat[n].reshape(deltas[0][n].shape).to(deltas[0][n].dtype) for n in names}


def value_updates(
    model: nn.Module,
    params: Mapping[str, Tensor],
    updates: Sequence[ClientUpdate],
    validation: EvalSet,
    number: int,
    spec: ValuationSpec | None,
    accounting: FederatedValuation,
    game_settings: GameSettings = GameSettings(),
    on_plan: Callable[[Plan], None] | None = None,
) -> RoundValues:
    """The round's values from w_t and its updates only (spec None: valuation off, utilities only).

    The values are recorded in `accounting` unless valuation is off. Valuation needs no message beyond
    the updates the round already received. on_plan: see fedsv.valuation.rounds.value_round.
    """
    ordered = _ordered(updates, number)
    ids = [u.participant for u in ordered]
    deltas = [u.delta for u in ordered]
    counts = [u.num_samples for u in ordered]
    game = RoundGame(
        model,
        params,
        deltas,
        counts,
        validation.x,
        validation.y,
        metric=game_settings.metric,
        aggregation=game_settings.aggregation,
        device=game_settings.device,
        precision=game_settings.precision,
    )
    if spec is None:  # valuation off: only U(empty) and U(all), the round's utilities
        before, after = (float(u) for u in game.utilities(np.array([[False] * len(ids), [True] * len(ids)])))
        zeros = np.zeros(len(ids))
        return RoundValues(number, ids, zeros, zeros.copy(), before, after, "none", 2, 0.0)
    return accounting.value_round(game, ids, number, spec, on_plan)


def step_round(
    model: nn.Module,
    params: Mapping[str, Tensor],
    updates: Sequence[ClientUpdate],
    validation: EvalSet,
    number: int,
    spec: ValuationSpec | None,
    accounting: FederatedValuation,
    game_settings: GameSettings = GameSettings(),
) -> RoundOutcome:
    """Aggregate the round's updates with FedAvg and value them, one after the other (inline)."""
    started = time.perf_counter()
    new_params = aggregate(params, updates, number, game_settings.aggregation)
    aggregated = time.perf_counter()
    values = value_updates(model, params, updates, validation, number, spec, accounting, game_settings)
    return RoundOutcome(
        params=new_params,
        values=values,
        aggregation_seconds=aggregated - started,
        valuation_seconds=time.perf_counter() - aggregated,
    )
