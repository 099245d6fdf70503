"""Every estimator by method name, in the order tables list them; every list of names derives from here."""

from __future__ import annotations

from fedsv.valuation.estimators.estimator import ESTIMATORS, Estimator
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.estimators.group_testing import GroupTesting
from fedsv.valuation.estimators.gtg import GTGShapley
from fedsv.valuation.estimators.kernel_shap import KernelSHAP, LeverageSHAP
from fedsv.valuation.estimators.loo import LeaveOneOut, RandomValues
from fedsv.valuation.estimators.permutation import PermutationSampling
from fedsv.valuation.estimators.regression import RegressionMSR
from fedsv.valuation.estimators.svarm import StratifiedSVARM

REGISTRY: dict[str, type[Estimator]] = {
    cls.method: cls
    for cls in (
        ExactShapley,
        RegressionMSR,
        StratifiedSVARM,
        KernelSHAP,
        LeverageSHAP,
        PermutationSampling,
        GTGShapley,
        GroupTesting,
        LeaveOneOut,
        RandomValues,
    )
}
assert set(REGISTRY) == set(ESTIMATORS), "an estimator class is defined but not listed here"

SAMPLING_METHODS = tuple(name for name, cls in REGISTRY.items() if cls.sampling)
"""The Shapley estimators that sample coalitions within a budget of distinct utility evaluations."""
SHAPLEY_METHODS = tuple(name for name, cls in REGISTRY.items() if cls.shapley)
"""Exact and the samplers: what estimates the Shapley value."""
BASELINES = tuple(name for name, cls in REGISTRY.items() if not cls.shapley)
"""Leave-one-out and random."""
METHODS = ("auto", *REGISTRY)
"""What a ValuationSpec may name: "auto" (exact when it fits, else the best sampler) or a method."""
