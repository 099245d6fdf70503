"""Which Flower strategies the wrapper can value: the aggregation rule fedsv's round game must use."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg, MultiKrum, Strategy

from fedsv.fl.aggregation import AggregationRule

RULES = {
    "FedAvg": "fedavg: the sample-count-weighted mean of the replies' arrays",
    "FedMedian": "median: the coordinate-wise median (the mean of the two middle values for an even count)",
    "FedTrimmedAvg": "trimmed_mean, trim = beta: floor(beta * n) values cut at each end, coordinate-wise",
    "Krum": "krum, byzantine = num_malicious_nodes: the reply with the smallest summed squared distance "
    "to its max(1, n - f - 2) nearest others",
    "MultiKrum": "multi_krum, byzantine = num_malicious_nodes, keep = num_nodes_to_select: the weighted "
    "mean of the keep best by Krum's score (Krum when keep is 1)",
}
"""The strategies valued, and the fedsv rule each one's aggregate_train computes (checked against
flwr.serverapp.strategy's code, flwr 1.42)."""


class UnsupportedStrategyError(TypeError):
    """A strategy whose aggregation fedsv cannot reproduce inside its round game (yet)."""


def _keeps(strategy: Strategy, base: type[Strategy]) -> bool:
    """The strategy is a `base` and aggregates with base.aggregate_train itself (not an override)."""
    return isinstance(strategy, base) and type(strategy).aggregate_train is base.aggregate_train


def aggregation_rule(strategy: Strategy) -> AggregationRule:
    """fedsv's rule for the strategy's aggregation; UnsupportedStrategyError (one line) otherwise.

    FedAvg and the subclasses that keep FedAvg.aggregate_train (FedProx, a FedAvg with its own client
    sampling or configuration) build w_{t+1} = sum_i n_i w_i / sum_i n_i: fedsv's "fedavg" with a
    server learning rate of 1. FedMedian, FedTrimmedAvg, Krum and MultiKrum map to fedsv's median,
    trimmed mean, Krum and Multi-Krum with the strategy's parameters (RULES). Each is translation
    equivariant, so the rule applied to the deltas w_i - w_t gives Flower's aggregate of the w_i. Server
    optimizers (FedAvgM, FedAdam, FedYogi, FedAdagrad), Bulyan, QFedAvg, the XGBoost strategies, the
    differential-privacy wrappers and any subclass with its own aggregate_train are refused.
    """
    if _keeps(strategy, FedAvg):
        return AggregationRule("fedavg")
    if _keeps(strategy, FedMedian):
        return AggregationRule("median")
    if _keeps(strategy, FedTrimmedAvg):
        assert isinstance(strategy, FedTrimmedAvg)
        return AggregationRule("trimmed_mean", trim=float(strategy.beta))
    if _keeps(strategy, MultiKrum):
        assert isinstance(strategy, MultiKrum)
        byzantine, keep = int(strategy.num_malicious_nodes), int(strategy.num_nodes_to_select)
        if keep < 1:
            raise UnsupportedStrategyError(
                f"FedSVStrategy cannot value {type(strategy).__name__} with num_nodes_to_select={keep}: "
                "it aggregates no reply"
            )
        if keep == 1:
            return AggregationRule("krum", byzantine=byzantine)
        return AggregationRule("multi_krum", byzantine=byzantine, keep=keep)
    raise UnsupportedStrategyError(
        f"FedSVStrategy cannot value {type(strategy).__name__}: it values FedAvg, FedProx, FedMedian, "
        "FedTrimmedAvg, Krum and MultiKrum (and subclasses that keep their aggregate_train)"
    )
