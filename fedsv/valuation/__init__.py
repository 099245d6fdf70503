"""fedsv.valuation: Shapley-value estimators for cooperative games and the federated SV across rounds.

Rooms, bottom up (docs/architecture.md): games (the estimators, numpy only), round (one FL round as a
game, in torch), accounting (values across rounds, completion, the recommended value, the verdict),
errors (what a value's standard error is made of); federated.py and round_valuation.py join them. The
names below load on first use, so that the estimators' room can be used without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsv.fl.aggregation import AggregationRule
    from fedsv.valuation.accounting.rounds import RoundValues
    from fedsv.valuation.federated import FederatedValuation
    from fedsv.valuation.games.api import Plan, plan, shapley_values
    from fedsv.valuation.games.estimator import Estimator
    from fedsv.valuation.games.exact import ExactShapley
    from fedsv.valuation.games.game import CallableGame, Game
    from fedsv.valuation.games.group_testing import GroupTesting
    from fedsv.valuation.games.gtg import GTGShapley
    from fedsv.valuation.games.kernel_shap import KernelSHAP, LeverageSHAP
    from fedsv.valuation.games.loo import LeaveOneOut, RandomValues
    from fedsv.valuation.games.permutation import PermutationSampling
    from fedsv.valuation.games.regression import RegressionMSR
    from fedsv.valuation.games.result import ValuationResult
    from fedsv.valuation.games.spec import ValuationSpec
    from fedsv.valuation.games.svarm import StratifiedSVARM
    from fedsv.valuation.round.round_game import RoundGame

_HOME = {
    "AggregationRule": "fedsv.fl.aggregation",
    "RoundValues": "fedsv.valuation.accounting.rounds",
    "FederatedValuation": "fedsv.valuation.federated",
    "Plan": "fedsv.valuation.games.api",
    "plan": "fedsv.valuation.games.api",
    "shapley_values": "fedsv.valuation.games.api",
    "Estimator": "fedsv.valuation.games.estimator",
    "ExactShapley": "fedsv.valuation.games.exact",
    "CallableGame": "fedsv.valuation.games.game",
    "Game": "fedsv.valuation.games.game",
    "GroupTesting": "fedsv.valuation.games.group_testing",
    "GTGShapley": "fedsv.valuation.games.gtg",
    "KernelSHAP": "fedsv.valuation.games.kernel_shap",
    "LeverageSHAP": "fedsv.valuation.games.kernel_shap",
    "LeaveOneOut": "fedsv.valuation.games.loo",
    "RandomValues": "fedsv.valuation.games.loo",
    "PermutationSampling": "fedsv.valuation.games.permutation",
    "RegressionMSR": "fedsv.valuation.games.regression",
    "ValuationResult": "fedsv.valuation.games.result",
    "ValuationSpec": "fedsv.valuation.games.spec",
    "StratifiedSVARM": "fedsv.valuation.games.svarm",
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
