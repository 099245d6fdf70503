"""fedsv.valuation: Shapley-value estimators for cooperative games and the federated SV across rounds.

Rooms, bottom up (docs/architecture.md): games (cooperative games, numpy only), estimators (the Shapley
estimators, samplers and their planning, numpy only), round (one FL round as a game, in torch),
accounting (values across rounds, completion, the recommended value, the verdict), errors (what a
value's standard error is made of); federated.py and round_valuation.py join them. The
names below load on first use, so that the estimators' room can be used without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsv.fl.aggregation import AggregationRule
    from fedsv.valuation.accounting.rounds import RoundValues
    from fedsv.valuation.estimators.api import Plan, plan, shapley_values
    from fedsv.valuation.estimators.estimator import Estimator
    from fedsv.valuation.estimators.exact import ExactShapley
    from fedsv.valuation.estimators.group_testing import GroupTesting
    from fedsv.valuation.estimators.gtg import GTGShapley
    from fedsv.valuation.estimators.kernel_shap import KernelSHAP, LeverageSHAP
    from fedsv.valuation.estimators.loo import LeaveOneOut, RandomValues
    from fedsv.valuation.estimators.permutation import PermutationSampling
    from fedsv.valuation.estimators.regression import RegressionMSR
    from fedsv.valuation.estimators.result import ValuationResult
    from fedsv.valuation.estimators.spec import ValuationSpec
    from fedsv.valuation.estimators.svarm import StratifiedSVARM
    from fedsv.valuation.federated import FederatedValuation
    from fedsv.valuation.games.game import CallableGame, Game
    from fedsv.valuation.round.round_game import RoundGame

_HOME = {
    "AggregationRule": "fedsv.fl.aggregation",
    "RoundValues": "fedsv.valuation.accounting.rounds",
    "FederatedValuation": "fedsv.valuation.federated",
    "Plan": "fedsv.valuation.estimators.api",
    "plan": "fedsv.valuation.estimators.api",
    "shapley_values": "fedsv.valuation.estimators.api",
    "Estimator": "fedsv.valuation.estimators.estimator",
    "ExactShapley": "fedsv.valuation.estimators.exact",
    "CallableGame": "fedsv.valuation.games.game",
    "Game": "fedsv.valuation.games.game",
    "GroupTesting": "fedsv.valuation.estimators.group_testing",
    "GTGShapley": "fedsv.valuation.estimators.gtg",
    "KernelSHAP": "fedsv.valuation.estimators.kernel_shap",
    "LeverageSHAP": "fedsv.valuation.estimators.kernel_shap",
    "LeaveOneOut": "fedsv.valuation.estimators.loo",
    "RandomValues": "fedsv.valuation.estimators.loo",
    "PermutationSampling": "fedsv.valuation.estimators.permutation",
    "RegressionMSR": "fedsv.valuation.estimators.regression",
    "ValuationResult": "fedsv.valuation.estimators.result",
    "ValuationSpec": "fedsv.valuation.estimators.spec",
    "StratifiedSVARM": "fedsv.valuation.estimators.svarm",
    "RoundGame": "fedsv.valuation.round.round_game",
}
"""Where each public name lives (RoundGame, the federated-SV game of one FL round, needs torch)."""

__all__ = [
    "AggregationRule",
    "CallableGame",
    "Estimator",
    "ExactShapley",
    "FederatedValuation",
    "GTGShapley",
    "Game",
    "GroupTesting",
    "KernelSHAP",
    "LeaveOneOut",
    "LeverageSHAP",
    "PermutationSampling",
    "Plan",
    "RandomValues",
    "RegressionMSR",
    "RoundGame",
    "RoundValues",
    "StratifiedSVARM",
    "ValuationResult",
    "ValuationSpec",
    "plan",
    "shapley_values",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'fedsv.valuation' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
