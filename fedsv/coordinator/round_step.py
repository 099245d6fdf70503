"""One round's pure step once its updates are in: aggregate, then value (inline), one after the other.

`fedsv demo` (in one process) and the coordinator's inline round loop both call step_round, and the
pipelined loop calls its two halves (fedsv.fl.aggregation.aggregate, then the valuation worker's
fedsv.valuation.round_valuation.value_updates), so the paths cannot drift: the same seed gives the same
selections, local-training seeds, models and values.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from fedsv.fl.aggregation import aggregate
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.updates import ClientUpdate
from fedsv.valuation import FederatedValuation, RoundValues, ValuationSpec
from fedsv.valuation.round_valuation import DEFAULT_GAME, GameSettings, value_updates


@dataclass(frozen=True)
class RoundOutcome:
    """w_{t+1}, the round's values (method "none": zeros, utilities only) and how long each part took."""

    params: dict[str, Tensor]
    values: RoundValues
    aggregation_seconds: float
    valuation_seconds: float


def step_round(
    model: nn.Module,
    params: Mapping[str, Tensor],
    updates: Sequence[ClientUpdate],
    validation: EvalSet,
    number: int,
    spec: ValuationSpec | None,
    accounting: FederatedValuation,
    game_settings: GameSettings = DEFAULT_GAME,
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
