"""The result object every estimator returns: values, evaluation count, standard errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class ValuationResult:
    """Shapley-type values of a game's m players and what it cost to compute them.

    values: one value per player (index i = player i).
    evaluations: distinct utility evaluations the estimator caused (memoized coalitions).
    method: the method actually used ("exact", "permutation", "group_testing", "loo", "random").
    stderr: per-player standard error of a sampling estimate; None for deterministic methods.
    utility_empty / utility_grand: U(empty set) and U(all players); their difference is what
        efficient methods distribute (instantaneous group rationality in FedSV).
    samples: permutations or tests drawn by a sampling method (0 otherwise).
    """

    values: npt.NDArray[np.float64]
    evaluations: int
    method: str
    stderr: npt.NDArray[np.float64] | None = None
    utility_empty: float = float("nan")
    utility_grand: float = float("nan")
    samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def m(self) -> int:
        return int(self.values.shape[0])

    @property
    def efficiency_residual(self) -> float:
        """sum(values) - (U(all) - U(empty)); zero for exact Shapley values."""
        return float(np.sum(self.values) - (self.utility_grand - self.utility_empty))

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": [float(v) for v in self.values],
            "evaluations": self.evaluations,
            "method": self.method,
            "stderr": None if self.stderr is None else [float(v) for v in self.stderr],
            "utility_empty": self.utility_empty,
            "utility_grand": self.utility_grand,
            "samples": self.samples,
        }
