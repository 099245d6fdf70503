"""valuation: Shapley-value estimators for cooperative games and the federated SV across rounds."""

from valuation.api import plan, shapley_values
from valuation.exact import ExactShapley
from valuation.game import CallableGame, Game
from valuation.group_testing import GroupTesting
from valuation.loo import LeaveOneOut, RandomValues
from valuation.permutation import PermutationSampling
from valuation.result import ValuationResult
from valuation.round_game import RoundGame  # the federated-SV game of one FL round (needs torch)
from valuation.rounds import FederatedValuation, RoundValues

__all__ = [
    "CallableGame",
    "ExactShapley",
    "FederatedValuation",
    "Game",
    "GroupTesting",
    "LeaveOneOut",
    "PermutationSampling",
    "RandomValues",
    "RoundGame",
    "RoundValues",
    "ValuationResult",
    "plan",
    "shapley_values",
]
