"""fedsv.valuation: Shapley-value estimators for cooperative games and the federated SV across rounds."""

from fedsv.fl.aggregation import AggregationRule
from fedsv.valuation.api import Plan, plan, shapley_values
from fedsv.valuation.estimator import Estimator
from fedsv.valuation.exact import ExactShapley
from fedsv.valuation.federated import FederatedValuation
from fedsv.valuation.game import CallableGame, Game
from fedsv.valuation.group_testing import GroupTesting
from fedsv.valuation.gtg import GTGShapley
from fedsv.valuation.kernel_shap import KernelSHAP, LeverageSHAP
from fedsv.valuation.loo import LeaveOneOut, RandomValues
from fedsv.valuation.permutation import PermutationSampling
from fedsv.valuation.regression import RegressionMSR
from fedsv.valuation.result import ValuationResult
from fedsv.valuation.round_game import RoundGame  # the federated-SV game of one FL round (needs torch)
from fedsv.valuation.rounds import RoundValues
from fedsv.valuation.spec import ValuationSpec
from fedsv.valuation.svarm import StratifiedSVARM

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
