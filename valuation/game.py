"""Cooperative games over a round's participants: memoized utilities of subsets, evaluated in batches."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

Subset = frozenset[int] | int
"""A coalition: a frozenset of player indices 0..m-1, or an int bitmask (bit i = player i)."""

BoolMatrix = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


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
    """

    def __init__(self, m: int) -> None:
        if int(m) < 1:
            raise ValueError(f"a game needs at least one player, got m={m}")
        self.m = int(m)
        self._cache: dict[bytes, float] = {}

    @property
    def evaluations(self) -> int:
        """Number of distinct coalitions whose utility has been evaluated."""
        return len(self._cache)

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        raise NotImplementedError

    def prepare(self) -> None:
        """Do the game's one-off set-up now (e.g. a round game's per-round precomputation), so that timing
        a batch of evaluations measures the cost per coalition only. The base game has none."""

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
        packed = np.packbits(members, axis=1)
        unique_packed, inverse = np.unique(packed, axis=0, return_inverse=True)
        keys = [row.tobytes() for row in unique_packed]
        missing = [k for k, key in enumerate(keys) if key not in self._cache]
        if missing:
            rows = np.unpackbits(unique_packed[missing], axis=1, count=self.m).astype(bool)
            values = np.asarray(self._evaluate(rows), dtype=np.float64)
            if values.shape != (len(missing),):
                raise RuntimeError(f"game returned {values.shape} utilities for {len(missing)} coalitions")
            if not np.all(np.isfinite(values)):
                raise ValueError("utility returned a non-finite value")
            for k, value in zip(missing, values, strict=True):
                self._cache[keys[k]] = float(value)
        unique_values = np.array([self._cache[key] for key in keys], dtype=np.float64)
        return unique_values[np.asarray(inverse).reshape(-1)]

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
