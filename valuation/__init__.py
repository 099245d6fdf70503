"""fedsv.valuation: Shapley-value estimators for cooperative games and the federated SV across rounds."""

from fedsv.valuation.api import Plan, plan, shapley_values
from fedsv.valuation.exact import ExactShapley
from fedsv.valuation.game import CallableGame, Game
from fedsv.valuation.group_testing import GroupTesting
from fedsv.valuation.loo import LeaveOneOut, RandomValues
from fedsv.valuation.permutation import PermutationSampling
from fedsv.valuation.result import ValuationResult
from fedsv.valuation.round_game import RoundGame  # the federated-SV game of one FL round (needs torch)
from fedsv.valuation.rounds import FederatedValuation, RoundValues
from fedsv.valuation.spec import ValuationSpec

__all__ = [
    "CallableGame",
    "ExactShapley",
    "FederatedValuation",
    "Game",
    "GroupTesting",
    "LeaveOneOut",
    "PermutationSampling",
    "Plan",
    "RandomValues",
    "RoundGame",
    "RoundValues",
    "ValuationResult",
    "ValuationSpec",
    "plan",
    "shapley_values",
]
