"""Which Flower strategies the wrapper can value: the aggregation rule fedsv's round game must use."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg, Strategy

RULES = {"fedavg": "FedAvg-like (sample-count-weighted mean of the replies' arrays)"}


class UnsupportedStrategyError(TypeError):
    """A strategy whose aggregation fedsv cannot reproduce inside its round game (yet)."""


def aggregation_rule(strategy: Strategy) -> str:
    """fedsv's name for the strategy's aggregation rule; UnsupportedStrategyError (one line) otherwise.

    FedAvg and the subclasses that keep FedAvg.aggregate_train (FedProx, a FedAvg with its own client
    sampling or configuration) build w_{t+1} = sum_i n_i w_i / sum_i n_i, which is fedsv's "fedavg"
    with a server learning rate of 1. Server optimizers (FedAvgM, FedAdam, FedYogi, FedAdagrad), robust
    rules (FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan), QFedAvg, the XGBoost strategies and the
    differential-privacy wrappers aggregate differently and are refused.
    """
    kind = type(strategy)
    if isinstance(strategy, FedAvg) and kind.aggregate_train is FedAvg.aggregate_train:
        return "fedavg"
    raise UnsupportedStrategyError(
        f"FedSVStrategy cannot value {kind.__name__}: it values FedAvg-like strategies only "
        "(FedAvg, FedProx, or a FedAvg subclass that keeps FedAvg.aggregate_train)"
    )
