"""A round game's utilities split by validation label: the store its evaluations fill, and its games.

With a per-sample metric (accuracy, the mean log-likelihood, any per-sample callable) the utility of a
coalition is (1/n) sum over validation samples of their scores, so it is the sum over labels c of
U_c(S) = (1/n) sum over the samples of label c. The Shapley value is linear in the utility, so the
per-label values add up to the value; they come from the same forward passes, at no extra evaluation.
"""

from __future__ import annotations

import numpy as np

from fedsv.valuation.game import DENSE_PLAYERS, BoolMatrix, FloatArray, Game, MaskArray, bitmasks

DENSE_CLASS_PLAYERS = 20
"""Up to this many players the store is a dense (2^m, classes) float32 table (2^20 x 10: 40 MiB)."""


class ClassScores:
    """Per coalition (bitmask), its per-label utilities; filled as the round game evaluates."""

    def __init__(self, m: int, classes: int) -> None:
        self.m, self.classes = m, classes
        self._dense = None
        if m <= DENSE_CLASS_PLAYERS:
            self._dense = np.full(
                (2**m, classes), np.nan, dtype=np.float32 if m > DENSE_PLAYERS else np.float64
            )
        self._sparse: dict[int, FloatArray] = {}

    def add(self, masks: MaskArray, utilities: FloatArray) -> None:
        """Record the per-label utilities (rows, (B, classes)) of the coalitions `masks`."""
        if self._dense is not None:
            self._dense[masks] = utilities
            return
        for mask, row in zip(masks.tolist(), utilities, strict=True):
            self._sparse[int(mask)] = np.asarray(row, dtype=np.float64)

    def get(self, masks: MaskArray, label: int) -> FloatArray:
        """Label `label`'s utilities of the coalitions `masks`; KeyError for one never evaluated."""
        if self._dense is not None:
            values = np.asarray(self._dense[masks, label], dtype=np.float64)
            if np.isnan(values).any():
                raise KeyError("a coalition the round game never evaluated")
            return values
        return np.array([self._sparse[int(mask)][label] for mask in masks.tolist()], dtype=np.float64)


class LabelGame(Game):
    """The game of one validation label, U_c(S), read from a round game's ClassScores: it evaluates
    nothing itself, so an estimator replayed on it must ask for coalitions the round game evaluated."""

    def __init__(self, store: ClassScores, label: int) -> None:
        super().__init__(store.m)
        self.store, self.label = store, label

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        return self.store.get(bitmasks(members), self.label)
