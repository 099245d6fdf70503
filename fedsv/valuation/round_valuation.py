"""The valuation of one FL round from the updates it aggregated: its RoundGame, valued and recorded."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor, nn

from fedsv.fl.aggregation import AggregationRule, ordered_updates
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.redundancy import delta_matrices, redundant_groups, weighed_once
from fedsv.fl.updates import ClientUpdate
from fedsv.valuation.accounting.rounds import RoundValues
from fedsv.valuation.estimators.api import Plan
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.federated import FederatedValuation
from fedsv.valuation.round.round_game import RoundGame
from fedsv.valuation.round.round_inputs import Metric


@dataclass(frozen=True)
class GameSettings:
    """How a round's game computes: its validation metric, the torch device ("auto": CUDA when
    present), the precision ("fp32", "tf32", "bf16"; see fedsv.valuation.RoundGame), and the
    aggregation rule, which the coordinator applies to the round and the game to every coalition."""

    metric: Metric = "accuracy"
    device: str = "cpu"
    precision: str = "fp32"
    aggregation: AggregationRule = field(default_factory=AggregationRule)


DEFAULT_GAME = GameSettings()


def value_updates(
    model: nn.Module,
    params: Mapping[str, Tensor],
    updates: Sequence[ClientUpdate],
    validation: EvalSet,
    number: int,
    spec: ValuationSpec | None,
    accounting: FederatedValuation,
    game_settings: GameSettings = DEFAULT_GAME,
    on_plan: Callable[[Plan], None] | None = None,
    selected: Sequence[str] | None = None,
) -> RoundValues:
    """The round's values from w_t and its updates only (spec None: valuation off, utilities only);
    `selected`: the round's selection, where some were not aggregated. Where the spec merges redundant
    members, those whose updates are far more alike than independent data give are valued as one
    player (fedsv.fl.redundancy); where the aggregation weighs them once (AggregationRule.once), so does
    every coalition of the game. An update marked public (ClientUpdate.public: nothing beyond the global
    model's recent steps, aggregated because the guard's screens were off) is in every coalition, the
    empty one too, and its member is valued exactly 0: what the coordinator broadcast earns nothing.
    With merging off, members whose updates look redundant are valued apart and named
    (RoundValues.alike), so that a report can say who may have joined twice.

    The values are recorded in `accounting` unless valuation is off. Valuation needs no message beyond
    the updates the round already received. on_plan: see fedsv.valuation.accounting.rounds.value_round.
    """
    ordered = ordered_updates(updates, number)
    ids = [u.participant for u in ordered]
    deltas = [u.delta for u in ordered]
    counts: list[float] = [float(u.num_samples) for u in ordered]
    merging = spec is not None and spec.merge_redundant
    public = [i for i, u in enumerate(ordered) if u.public]
    # the deltas as received, as the coordinator's aggregation found them (fedsv.fl.aggregation)
    groups = redundant_groups(delta_matrices(deltas)) if merging or game_settings.aggregation.once else None
    if groups is not None and game_settings.aggregation.once:  # the game weighs them as the round did
        counts = weighed_once(groups, counts)
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
    if groups is None:  # merging off: the same test on the game's own stacked deltas (no copy), to name
        groups = redundant_groups(list(game.inputs.delta_matrices.values()))  # look-alike members
    if public:  # a public update is in every coalition, in no group
        groups = [kept for g in groups if (kept := [i for i in g if i not in public])]
    alike = [] if merging else [g for g in groups if len(g) > 1]
    return accounting.value_round(
        game, ids, number, spec, on_plan, selected, groups if merging else None, public, alike
    )
