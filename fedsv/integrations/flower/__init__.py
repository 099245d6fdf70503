"""Federated Shapley values for Flower (flwr >= 1.41, Message API); see docs/flower.md."""

from fedsv.integrations.flower.names import fedsv_names
from fedsv.integrations.flower.rules import UnsupportedStrategyError, aggregation_rule
from fedsv.integrations.flower.strategy import FedSVStrategy

__all__ = ["FedSVStrategy", "UnsupportedStrategyError", "aggregation_rule", "fedsv_names"]
