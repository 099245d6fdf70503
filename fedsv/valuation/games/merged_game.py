"""A game whose players are groups of another game's players: redundant members valued as one player, and
members whose updates hold nothing the coordinator did not already have in every coalition, valued 0."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsv.valuation.games.game import (
    DENSE_PLAYERS,
    BoolMatrix,
    CellScores,
    FloatArray,
    Game,
    MaskArray,
    bitmasks,
    members_of,
)

Groups = list[list[int]]
"""A partition of a game's players 0..m-1 into groups, each a sorted list of player indices."""


def check_groups(groups: Sequence[Sequence[int]], m: int, always: Sequence[int] = ()) -> Groups:
    """`groups` as sorted lists, checked to be a partition of the players 0..m-1 not in `always`
    (ordered by their first player)."""
    out = sorted((sorted(int(i) for i in g) for g in groups), key=lambda g: g[0] if g else -1)
    seen = [i for g in out for i in g]
    rest = sorted(set(range(m)) - {int(i) for i in always})
    if any(not g for g in out) or sorted(seen) != rest or not out:
        raise ValueError(f"groups {groups} are not a partition of the players {rest}")
    return out


def alone(m: int, always: Sequence[int] = ()) -> Groups:
    """Every player not in `always` a group of its own."""
    fixed = {int(i) for i in always}
    return [[i] for i in range(m) if i not in fixed]


def merges(groups: Groups) -> bool:
    """Whether any group holds more than one player (otherwise merging changes nothing)."""
    return any(len(g) > 1 for g in groups)


class _Expansion:
    """Maps coalitions of k groups to coalitions of the m players they hold, with `always` in each."""

    def __init__(self, groups: Groups, m: int, always: Sequence[int] = ()) -> None:
        self.groups, self.m, self.k = groups, m, len(groups)
        self.assignment = np.zeros((self.k, m), dtype=bool)  # group g holds player i
        for g, players in enumerate(groups):
            self.assignment[g, players] = True
        self.always = np.zeros(m, dtype=bool)
        self.always[list(always)] = True

    def rows(self, members: BoolMatrix) -> BoolMatrix:
        held = (np.asarray(members, dtype=np.int64) @ self.assignment.astype(np.int64)) > 0
        return held | self.always[None, :]

    def masks(self, masks: MaskArray) -> MaskArray:
        return bitmasks(self.rows(members_of(masks, self.k)))


class MergedGame(Game):
    """`inner` with its players merged into `groups`: a coalition of groups is the coalition of every
    player they hold, and of every player in `always` (players outside every group: in each coalition,
    the empty one too, so their value is 0 and U(empty) holds them). Its utilities, per-cell scores and
    surrogate are the inner game's, read through the groups, so every estimator values it unchanged (and
    the inner game's cache serves both)."""

    def __init__(self, inner: Game, groups: Sequence[Sequence[int]], always: Sequence[int] = ()) -> None:
        self.always = sorted({int(i) for i in always})
        self.groups = check_groups(groups, inner.m, self.always)
        super().__init__(len(self.groups))
        self.inner, self._expansion = inner, _Expansion(self.groups, inner.m, self.always)
        self.resolution = inner.resolution
        self.computed_by = inner.computed_by
        self.computes_on_cpu = inner.computes_on_cpu

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        return self.inner.utilities(self._expansion.rows(members))

    def prepare(self) -> None:
        self.inner.prepare()

    def surrogate(self) -> Game | None:
        cheap = self.inner.surrogate()
        return None if cheap is None else MergedGame(cheap, self.groups, self.always)

    def cell_scores(self) -> CellScores | None:
        store = self.inner.cell_scores()
        return None if store is None else MergedCells(store, self._expansion)

    def expand(self, values: FloatArray) -> FloatArray:
        """Per-group values (k, ...) to per-player ones (m, ...): a group's value split equally, 0 for a
        player in every coalition."""
        values = np.asarray(values, dtype=np.float64)
        out = np.zeros((self.inner.m, *values.shape[1:]), dtype=np.float64)
        for g, players in enumerate(self.groups):
            out[players] = values[g] / len(players)
        return out


class MergedCells:
    """An inner game's per-cell scores (class_scores.CellScores) read through the groups."""

    def __init__(self, store: CellScores, expansion: _Expansion) -> None:
        self.store, self._expansion = store, expansion
        self.m, self.classes, self.folds = expansion.k, store.classes, store.folds
        self.width, self.shares = store.width, store.shares

    def get(self, masks: MaskArray, cells: slice | list[int]) -> FloatArray:
        return self.store.get(self._expansion.masks(np.asarray(masks, dtype=np.int64)), cells)

    def table(self) -> FloatArray | None:
        """Every coalition of groups' per-cell utilities (2^k, width), when the inner game evaluated all
        of them (the inner game's own table never fills: it is asked for unions of groups only)."""
        if self.m > DENSE_PLAYERS:
            return None
        masks = self._expansion.masks(np.arange(2**self.m, dtype=np.int64))
        try:
            return np.stack([self.store.get(masks, [cell]) for cell in range(self.width)], axis=1)
        except KeyError:
            return None

    def label(self, label: int) -> slice:
        return self.store.label(label)

    def fold(self, fold: int) -> slice:
        return self.store.fold(fold)
