"""A run's coalitions rebuilt from the updates the coordinator aggregated: the reconstructed run game."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.fl.evaluation import EvalSet, to_tensors
from fedsv.fl.updates import ClientUpdate
from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game
from fedsv.valuation.round.round_inputs import Metric, score_params


class ReconstructedRun(Game):
    """U(S) = metric(w_0 + the sum over rounds of the FedAvg of S's updates aggregated in that round),
    U(empty) = metric(w_0): every coalition's model over the whole run rebuilt from the updates the
    coordinator received, without retraining and without a message (the one-round reconstruction of Song
    et al., "Profit Allocation for Federated Learning", IEEE Big Data 2019). A round none of S was
    aggregated in adds nothing. Its Shapley value approximates the canonical one (every coalition
    retrained: fedsv.valuation.estimators.canonical); an update was computed at the run's w_t, not at the
    coalition's own model. Weights are the updates' sample counts (FedAvg's rule)."""

    def __init__(
        self,
        model: nn.Module,
        initial: Mapping[str, Tensor],
        rounds: Sequence[Sequence[ClientUpdate]],
        players: Sequence[str],
        validation: EvalSet,
        metric: Metric = "accuracy",
    ) -> None:
        super().__init__(len(players))
        index = {pid: i for i, pid in enumerate(players)}
        if len(index) != len(players):
            raise ValueError("the reconstructed run's players must be distinct")
        unknown = sorted({u.participant for r in rounds for u in r} - set(index))
        if unknown:
            raise ValueError(f"updates from participants that are not players: {unknown}")
        self._model, self._metric = model, metric
        self._initial = {name: t.detach() for name, t in initial.items()}
        self._rounds = [[(index[u.participant], u.delta, float(u.num_samples)) for u in r] for r in rounds]
        self._x, self._y = to_tensors(validation.x, validation.y)

    def params(self, coalition: np.ndarray) -> dict[str, Tensor]:
        """The model the coalition (a membership row) is rebuilt to."""
        params = {name: t.clone() for name, t in self._initial.items()}
        for updates in self._rounds:
            held = [(delta, count) for i, delta, count in updates if coalition[i]]
            total = sum(count for _, count in held)
            if total <= 0:
                continue
            for name, value in params.items():
                if value.is_floating_point() and all(name in delta for delta, _ in held):
                    step = sum(
                        (delta[name].to(value.dtype) * (count / total) for delta, count in held),
                        torch.zeros_like(value),
                    )
                    params[name] = value + step
        return params

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        return np.array(
            [score_params(self._model, self.params(row), self._x, self._y, self._metric) for row in members],
            dtype=np.float64,
        )
