"""Cooperative games over a round's participants: memoized utilities of subsets, evaluated in batches."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
import numpy.typing as npt

Subset = frozenset[int] | int
"""A coalition: a frozenset of player indices 0..m-1, or an int bitmask (bit i = player i)."""

BoolMatrix = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
MaskArray = npt.NDArray[np.int64]


class CellScores(Protocol):
    """What reads a game's utilities by validation cell (CellGame, the fold and label games): a round
    game's ClassScores, or a residual's (surrogate.ResidualScores)."""

    m: int
    classes: int
    folds: int
    width: int
    shares: FloatArray

    def get(self, masks: MaskArray, cells: slice | list[int]) -> FloatArray: ...

    def table(self) -> FloatArray | None: ...

    def label(self, label: int) -> slice: ...

    def fold(self, fold: int) -> slice: ...


DENSE_PLAYERS = 16
"""Games of at most this many players memoize in a dense table from the start (2^16 floats: 512 KiB)."""

MAX_DENSE_PLAYERS = 30
"""The largest game a dense table may hold (2^30 floats: 8 GiB); exact enumeration stops well before."""


def bitmasks(members: BoolMatrix) -> MaskArray:
    """Bitmask of every row of a membership matrix with at most 62 columns (bit i = player i)."""
    members = np.asarray(members, dtype=bool)
    if members.shape[1] > 62:
        raise ValueError(f"bitmasks hold at most 62 players, got {members.shape[1]}")
    packed = np.packbits(members, axis=1, bitorder="little")
    padded = np.zeros((members.shape[0], 8), dtype=np.uint8)
    padded[:, : packed.shape[1]] = packed
    return padded.view("<i8").reshape(-1).astype(np.int64, copy=False)


def members_of(masks: MaskArray, m: int) -> BoolMatrix:
    """Membership matrix (B, m) of bitmasks (the inverse of `bitmasks`)."""
    as_bytes = np.ascontiguousarray(np.asarray(masks, dtype="<i8")).view(np.uint8).reshape(-1, 8)
    return np.unpackbits(as_bytes, axis=1, count=m, bitorder="little").astype(bool)


def subset_to_row(subset: Subset | Iterable[int], m: int) -> npt.NDArray[np.bool_]:
    """Membership row of length m for a frozenset, iterable of indices or bitmask."""
    row = np.zeros(m, dtype=bool)
    if isinstance(subset, (int, np.integer)):
        mask = int(subset)
        if mask < 0 or mask >> m:
            raise ValueError(f"bitmask {mask:#x} names players outside 0..{m - 1}")
        for i in range(m):
            row[i] = bool((mask >> i) & 1)
        return row
    for i in subset:
        if not 0 <= int(i) < m:
            raise ValueError(f"player index {i} outside 0..{m - 1}")
        row[int(i)] = True
    return row


def row_to_subset(row: npt.NDArray[np.bool_]) -> frozenset[int]:
    """The frozenset of player indices whose membership bit is set."""
    return frozenset(int(i) for i in np.flatnonzero(row))


class Game:
    """A cooperative game of m players with a memoized, batch-evaluated utility.

    Subclasses implement `_evaluate(members)`: utilities of the coalitions given as rows of a
    boolean membership matrix of shape (B, m). Estimators call `utilities(members)`, which
    evaluates each distinct coalition at most once over the game's lifetime; `evaluations`
    counts the distinct coalitions evaluated so far.

    The memo is a dense table indexed by bitmask (NaN: not evaluated) for games of at most
    DENSE_PLAYERS players, or once `use_dense_table()` was called (exact enumeration does): lookups
    are then vectorized, with no Python work per coalition. Larger games memoize in a dict.
    """

    computed_by: str = ""
    """How the game computes its coalitions, for people ("" where there is nothing to say)."""

    computes_on_cpu: bool = True
    """Its work runs on this process's CPU threads, so their CPU time measures it (api.measure_cost)."""

    resolution: float | None = None
    """The utilities' smallest step where they lie on a lattice (an accuracy over n validation samples:
    1/n), else None: a sampler that sees no spread in a stratum then states the spread that a step it
    did not see could have (strata.StratumMeans)."""

    def __init__(self, m: int) -> None:
        if int(m) < 1:
            raise ValueError(f"a game needs at least one player, got m={m}")
        self.m = int(m)
        self._cache: dict[bytes, float] = {}
        self._table: FloatArray | None = None
        self._dense_count = 0

    @property
    def evaluations(self) -> int:
        """Number of distinct coalitions whose utility has been evaluated."""
        return self._dense_count + len(self._cache)

    def use_dense_table(self) -> None:
        """Memoize in a dense table of all 2^m coalitions from now on (what is cached moves into it)."""
        if self._table is not None:
            return
        if self.m > MAX_DENSE_PLAYERS:
            raise ValueError(f"a dense table holds at most {MAX_DENSE_PLAYERS} players, got m={self.m}")
        table = np.full(2**self.m, np.nan, dtype=np.float64)
        if self._cache:
            keys = np.frombuffer(b"".join(self._cache), dtype=np.uint8).reshape(len(self._cache), -1)
            rows = np.unpackbits(keys, axis=1, count=self.m).astype(bool)
            table[bitmasks(rows)] = np.fromiter(self._cache.values(), dtype=np.float64, count=len(keys))
        self._dense_count, self._cache, self._table = len(self._cache), {}, table

    def dense_table(self) -> FloatArray | None:
        """The dense memo (utility of bitmask b at index b, NaN where not evaluated), if the game has one."""
        if self._table is None and self.m <= DENSE_PLAYERS:
            self.use_dense_table()
        return self._table

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        raise NotImplementedError

    def prepare(self) -> None:
        """Do the game's one-off set-up now (e.g. a round game's per-round precomputation), so that timing
        a batch of evaluations measures the cost per coalition only. The base game has none."""

    def surrogate(self) -> Game | None:
        """A cheap game that follows this one, for a control variate (surrogate.SurrogateCorrected): a
        round game's model linearized around w_t. None where the game has none (the base game)."""
        return None

    def cell_scores(self) -> CellScores | None:
        """The utilities of what this game evaluated split by validation cell (label and fold: a round
        game's class_scores.ClassScores), whose games sum to this one; None when the game does not
        split."""
        return None

    def evaluate_uncached(self, members: BoolMatrix) -> FloatArray:
        """Utilities of `members` computed afresh, neither read from nor added to the cache (to time
        the game without changing what an estimator will find cached)."""
        return np.asarray(self._evaluate(np.asarray(members, dtype=bool)), dtype=np.float64)

    def new_rows(self, members: BoolMatrix) -> npt.NDArray[np.bool_]:
        """Per row: True where the coalition is not cached and is its first occurrence in `members`,
        i.e. the rows that evaluating `members` would count as new distinct evaluations."""
        members = np.asarray(members, dtype=bool)
        if members.ndim != 2 or members.shape[1] != self.m:
            raise ValueError(f"membership matrix must have shape (B, {self.m}), got {members.shape}")
        fresh = np.zeros(members.shape[0], dtype=bool)
        if members.shape[0] == 0:
            return fresh
        table = self.dense_table()
        if table is not None:
            masks = bitmasks(members)
            unique_masks, first_of = np.unique(masks, return_index=True)
            fresh[first_of[np.isnan(table[unique_masks])]] = True
            return fresh
        unique, first = np.unique(np.packbits(members, axis=1), axis=0, return_index=True)
        uncached = np.array([row.tobytes() not in self._cache for row in unique], dtype=bool)
        fresh[first[uncached]] = True
        return fresh

    def utilities(self, members: BoolMatrix) -> FloatArray:
        """Utilities of the coalitions in the rows of `members` (shape (B, m)), memoized."""
        members = np.asarray(members, dtype=bool)
        if members.ndim != 2 or members.shape[1] != self.m:
            raise ValueError(f"membership matrix must have shape (B, {self.m}), got {members.shape}")
        if members.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        table = self.dense_table()
        if table is not None:
            return self._dense_utilities(table, members)
        packed = np.packbits(members, axis=1)
        unique_packed, inverse = np.unique(packed, axis=0, return_inverse=True)
        keys = [row.tobytes() for row in unique_packed]
        missing = [k for k, key in enumerate(keys) if key not in self._cache]
        if missing:
            rows = np.unpackbits(unique_packed[missing], axis=1, count=self.m).astype(bool)
            values = self._checked(rows)
            for k, value in zip(missing, values, strict=True):
                self._cache[keys[k]] = float(value)
        unique_values = np.array([self._cache[key] for key in keys], dtype=np.float64)
        return unique_values[np.asarray(inverse).reshape(-1)]

    def _dense_utilities(self, table: FloatArray, members: BoolMatrix) -> FloatArray:
        masks = bitmasks(members)
        found = table[masks]
        missing = np.isnan(found)
        if not missing.any():
            return found
        new_masks = masks[missing]
        if new_masks.shape[0] > 1 and not np.all(new_masks[1:] > new_masks[:-1]):  # enumeration: sorted
            new_masks = np.unique(new_masks)
        values = self._checked(members_of(new_masks, self.m))
        table[new_masks] = values
        self._dense_count += len(new_masks)
        return table[masks]

    def _checked(self, rows: BoolMatrix) -> FloatArray:
        """The subclass's utilities of `rows`, checked: one finite value per row."""
        values = np.asarray(self._evaluate(rows), dtype=np.float64)
        if values.shape != (rows.shape[0],):
            raise RuntimeError(f"game returned {values.shape} utilities for {rows.shape[0]} coalitions")
        if not np.all(np.isfinite(values)):
            raise ValueError("utility returned a non-finite value")
        return values

    def utility(self, subset: Subset) -> float:
        """Utility of one coalition (frozenset of indices or bitmask)."""
        return float(self.utilities(subset_to_row(subset, self.m)[None, :])[0])

    def empty_and_grand(self) -> tuple[float, float]:
        """U(empty set) and U(all players)."""
        rows = np.zeros((2, self.m), dtype=bool)
        rows[1] = True
        values = self.utilities(rows)
        return float(values[0]), float(values[1])


class CallableGame(Game):
    """A game defined by any callable mapping a frozenset of player indices to a float."""

    def __init__(self, utility: Callable[[frozenset[int]], float], m: int) -> None:
        super().__init__(m)
        if not callable(utility):
            raise ValueError("utility must be callable on a frozenset of player indices")
        self._fn = utility

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        return np.array([float(self._fn(row_to_subset(row))) for row in members], dtype=np.float64)


def as_game(utility: Game | Callable[[frozenset[int]], float], m: int | None) -> Game:
    """Wrap a plain callable into a memoized Game; pass Games through after checking m."""
    if isinstance(utility, Game):
        if m is not None and int(m) != utility.m:
            raise ValueError(f"m={m} does not match the game's {utility.m} players")
        return utility
    if m is None:
        raise ValueError("m (number of players) is required when utility is a plain callable")
    return CallableGame(utility, m)
