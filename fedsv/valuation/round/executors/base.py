"""The executor contract: the summed per-sample scores of a batch of coalitions, on the game's device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import Tensor

from fedsv.valuation.round.executors.compute import Compute, Memory
from fedsv.valuation.round.round_inputs import RoundInputs


class Executor(ABC):
    """Evaluates coalitions of a round game. `mode` names the family ("fast", "batched", "naive");
    `how` says what runs the forward passes (for the log and the tests)."""

    mode: ClassVar[str]

    def __init__(self, inputs: RoundInputs, compute: Compute, memory: Memory) -> None:
        self.inputs, self.compute, self.memory = inputs, compute, memory

    @property
    def how(self) -> str:
        return self.mode

    def prepare(self) -> None:
        """Do the once-per-round work now (so that timing a batch measures the cost per coalition); most
        executors have none."""
        return None

    @abstractmethod
    def totals(self, coeffs: Tensor) -> Tensor:
        """Per coalition (rows of the coefficients (B, m)) and validation cell (a label and a fold,
        RoundInputs.cells), the sum of its per-sample scores: float64 (B, width) on the game's device
        (round_inputs.score_logits). Called inside compute.computing()."""
