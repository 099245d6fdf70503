"""Values per validation label: the round's estimator replayed on each label's game, at no evaluation.

A round game splits into per-label games (class_scores.LabelGame) whose utilities sum to its own. The
estimator that valued the round is run again on each, with the same seed and the same budgets in the
same order, so it asks for exactly the coalitions the round game evaluated; every estimator here but
GTG-Shapley is linear in the utilities of the coalitions it saw, so the labels' values add up to the
participants' values (to float rounding). GTG truncates permutations on the utilities it sees, which
is not linear: a round valued with it has no values per label.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.api import Plan, make_estimator
from fedsv.valuation.game import FloatArray, Game
from fedsv.valuation.methods import REGISTRY
from fedsv.valuation.result import ValuationResult
from fedsv.valuation.spec import ValuationSpec

NOT_LINEAR = ("gtg", "random")
"""Methods whose values are not a linear function of the utilities they saw."""


@dataclass(frozen=True)
class ClassValues:
    """Per participant (rows) and validation label (columns): values and their standard errors."""

    values: FloatArray
    stderr: FloatArray


def class_values(
    game: Game, chosen: Plan, spec: ValuationSpec, result: ValuationResult
) -> ClassValues | None:
    """The values per label of a round `result` valued by `chosen`; None where the game does not split
    or the method is not linear."""
    parts = game.components()
    if parts is None or chosen.method in NOT_LINEAR:
        return None
    runs = [_replay(part, chosen, spec, result) for part in parts]
    zeros = np.zeros(game.m)
    return ClassValues(
        np.stack([r.values for r in runs], axis=1),
        np.stack([zeros if r.stderr is None else r.stderr for r in runs], axis=1),
    )


def _replay(part: Game, chosen: Plan, spec: ValuationSpec, result: ValuationResult) -> ValuationResult:
    """The estimator of `result` on one label's game: a run to a target is replayed attempt by attempt."""
    target = result.extra.get("target")
    if target is None:
        return make_estimator(chosen, spec).run(part)
    sampler, settings = REGISTRY[chosen.method], dataclasses.replace(spec.settings(), capped=True)
    replayed = result
    for allowance in target["allowances"]:
        replayed = sampler.configured(allowance, settings).run(part)
    return replayed
