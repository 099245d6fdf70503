"""A round game's utilities split by validation cell (label and fold): the store its evaluations fill,
and the games of a label, of a fold and of a cell read from it.

With a per-sample metric (accuracy, the mean log-likelihood, any per-sample callable) the utility of a
coalition is (1/n) sum over validation samples of their scores, so it is the sum over cells of
U_cell(S) = (1/n) sum over the cell's samples. The Shapley value is linear in the utility, so the
values of the labels (or of the folds) add up to the value; they come from the same forward passes, at
no extra evaluation. The folds are a fixed, seeded split of the validation set (fold_of): the spread of
the values measured on each fold alone is what a fresh draw of the validation set would change
(valuation_noise.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fedsv.valuation.games.game import (
    DENSE_PLAYERS,
    BoolMatrix,
    CellScores,
    FloatArray,
    Game,
    MaskArray,
    bitmasks,
)

DENSE_CLASS_PLAYERS = 20
"""Up to this many players the store is a dense (2^m, cells) table while it fits DENSE_CELL_BYTES."""

DENSE_CELL_BYTES = 256 * 2**20
"""The largest dense store: m = 20 with 10 labels holds 4 folds (2^20 x 40 float32: 160 MiB)."""

FOLDS = (8, 4, 2)
"""Validation folds, most first; fewer where the dense store would not fit. Each count divides the
ones before it, so fold f of a split into fewer is the union of the folds f' of a finer split with
f' % count = f: rounds split into different counts still add up fold by fold (valuation_noise)."""

MIN_FOLD_SAMPLES = 2
"""A fold needs at least this many validation samples; a smaller set has one fold (no validation error)."""


def fold_count(m: int, classes: int, samples: int) -> int:
    """How many validation folds a round game of m players and `classes` labels splits its scores into."""
    for folds in FOLDS:
        if samples >= MIN_FOLD_SAMPLES * folds and (
            m > DENSE_CLASS_PLAYERS or 2**m * classes * folds * _itemsize(m) <= DENSE_CELL_BYTES
        ):
            return folds
    return 1


def fold_of(samples: int) -> npt.NDArray[np.int64]:
    """Each validation sample's fold among FOLDS[0]: a fixed permutation (seed 0) dealt round-robin, so
    the folds differ in size by at most one and every round of a run splits its validation set alike."""
    order = np.random.default_rng(0).permutation(samples)
    folds = np.empty(samples, dtype=np.int64)
    folds[order] = np.arange(samples) % FOLDS[0]
    return folds


def fold_split(samples: int, folds: int) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """Each validation sample's fold among `folds` (fold_of merged: f % folds) and each fold's share."""
    fold = fold_of(samples) % folds
    return fold, np.bincount(fold, minlength=folds) / max(samples, 1)


def _itemsize(m: int) -> int:
    return 4 if m > DENSE_PLAYERS else 8


class ClassScores:
    """Per coalition (bitmask), its per-cell utilities (cell = label * folds + fold); filled as the round
    game evaluates."""

    def __init__(self, m: int, classes: int, shares: FloatArray | None = None) -> None:
        self.shares = np.ones(1) if shares is None else np.asarray(shares, dtype=np.float64)
        self.m, self.classes, self.folds = m, classes, int(self.shares.shape[0])
        self.width = classes * self.folds
        self._dense = None
        if m <= DENSE_CLASS_PLAYERS and 2**m * self.width * _itemsize(m) <= DENSE_CELL_BYTES:
            self._dense = np.full(
                (2**m, self.width), np.nan, dtype=np.float32 if m > DENSE_PLAYERS else np.float64
            )
        self._sparse: dict[int, FloatArray] = {}

    def add(self, masks: MaskArray, utilities: FloatArray) -> None:
        """Record the per-cell utilities (rows, (B, width)) of the coalitions `masks`."""
        if self._dense is not None:
            self._dense[masks] = utilities
            return
        for mask, row in zip(masks.tolist(), utilities, strict=True):
            self._sparse[int(mask)] = np.asarray(row, dtype=np.float64)

    def get(self, masks: MaskArray, cells: slice | list[int]) -> FloatArray:
        """The summed utilities of `cells` of the coalitions `masks`; KeyError for one never evaluated."""
        if self._dense is not None:
            values = np.asarray(self._dense[masks][:, cells], dtype=np.float64).sum(axis=1)
            if np.isnan(values).any():
                raise KeyError("a coalition the round game never evaluated")
            return values
        return np.array(
            [float(self._sparse[int(mask)][cells].sum()) for mask in masks.tolist()], dtype=np.float64
        )

    def table(self) -> FloatArray | None:
        """Every coalition's per-cell utilities in bitmask order (2^m, width), when all were evaluated."""
        if self._dense is None or np.isnan(self._dense).any():
            return None
        return np.asarray(self._dense, dtype=np.float64)

    def label(self, label: int) -> slice:
        """The cells of one validation label."""
        return slice(label * self.folds, (label + 1) * self.folds)

    def fold(self, fold: int) -> slice:
        """The cells of one validation fold."""
        return slice(fold, self.width, self.folds)


class CellGame(Game):
    """The game of some cells of the validation set (one label, one fold, or one of each), read from a
    round game's ClassScores: it evaluates nothing itself, so an estimator replayed on it must ask for
    coalitions the round game evaluated. `resolution`: the round game's (Game.resolution)."""

    def __init__(self, store: CellScores, cells: slice | list[int], resolution: float | None = None) -> None:
        super().__init__(store.m)
        self.store, self.cells, self.resolution = store, cells, resolution

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        return self.store.get(bitmasks(members), self.cells)


def label_games(store: CellScores) -> list[Game]:
    """One game per validation label; they sum to the round game."""
    return [CellGame(store, store.label(label)) for label in range(store.classes)]


def fold_games(store: CellScores) -> list[Game]:
    """One game per validation fold; they sum to the round game (none where there is a single fold)."""
    return [CellGame(store, store.fold(fold)) for fold in range(store.folds)] if store.folds > 1 else []
