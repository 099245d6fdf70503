"""Trusted data that judges a round's updates: the coordinator's validation set, its loss and descent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch.nn.functional as F
from torch import Tensor, nn

from fedsv.fl.evaluation import EvalSet, evaluate, predict, to_tensors, validation_descent
from fedsv.fl.state import apply_delta


class Referee(Protocol):
    """Trusted data that judges a round's updates from w_t."""

    def descent(self) -> dict[str, Tensor]:
        """-grad of the loss at w_t, per trainable parameter (the direction that helps)."""
        ...

    def loss(self, delta: Mapping[str, Tensor]) -> float:
        """The loss of w_t + delta."""
        ...

    def losses(self, delta: Mapping[str, Tensor]) -> Tensor:
        """The loss of w_t + delta on each trusted sample (their mean is `loss`)."""
        ...


class ValidationReferee:
    """The coordinator's validation set as Referee (mean cross-entropy, the model in eval mode); the
    gradient is computed once, when first asked for."""

    def __init__(self, model: nn.Module, params: Mapping[str, Tensor], validation: EvalSet) -> None:
        self.model, self.params, self.validation = model, params, validation
        self._descent: dict[str, Tensor] | None = None

    def descent(self) -> dict[str, Tensor]:
        if self._descent is None:
            self._descent = validation_descent(self.model, self.params, self.validation)
        return self._descent

    def loss(self, delta: Mapping[str, Tensor]) -> float:
        return evaluate(self.model, apply_delta(self.params, delta), self.validation.x, self.validation.y)[1]

    def losses(self, delta: Mapping[str, Tensor]) -> Tensor:
        _, y = to_tensors(self.validation.x, self.validation.y)
        logits = predict(self.model, apply_delta(self.params, delta), self.validation.x)
        return F.cross_entropy(logits.double(), y.to(logits.device), reduction="none").cpu()
