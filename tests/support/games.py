"""Games with closed-form Shapley values, and fast table games, for the valuation tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.exact import all_coalitions
from fedsv.valuation.games.class_scores import ClassScores, fold_split
from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game, bitmasks

Utility = Callable[[frozenset[int]], float]
ClosedForm = tuple[Utility, int, npt.NDArray[np.float64]]


def additive(weights: list[float], offset: float = 0.0) -> ClosedForm:
    """U(S) = offset + sum_{i in S} w_i: values are the weights."""
    w = np.asarray(weights, dtype=np.float64)
    return (lambda s: offset + float(sum(w[i] for i in s))), len(w), w.copy()


def symmetric(m: int, quota: int, offset: float = 0.0) -> ClosedForm:
    """Symmetric majority game U(S) = offset + [|S| >= quota]: every value is 1/m."""
    return (lambda s: offset + float(len(s) >= quota)), m, np.full(m, 1.0 / m)


def glove(rights: int) -> ClosedForm:
    """Player 0 holds a left glove, players 1..rights a right glove; U(S) = min(#left, #right).

    The left glove is worth n/(n+1) (it pays whenever some right glove precedes it), each right 1/(n(n+1)).
    """
    n = rights

    def u(s: frozenset[int]) -> float:
        return float(min(int(0 in s), len(s - {0})))

    return u, n + 1, np.array([n / (n + 1)] + [1.0 / (n * (n + 1))] * n)


def squared_sum(a: list[float]) -> ClosedForm:
    """U(S) = (sum_{i in S} a_i)^2: values a_i * sum_j a_j."""
    arr = np.asarray(a, dtype=np.float64)
    return (lambda s: float(sum(arr[i] for i in s)) ** 2), len(arr), arr * arr.sum()


def unanimity(m: int, carrier: set[int]) -> ClosedForm:
    """U(S) = 1 if carrier is a subset of S: 1/|carrier| inside the carrier, 0 outside."""
    t = frozenset(carrier)
    expected = np.array([1.0 / len(t) if i in t else 0.0 for i in range(m)])
    return (lambda s: float(t <= s)), m, expected


def airport(costs: list[float]) -> ClosedForm:
    """U(S) = -max_{i in S} c_i (0 for the empty set): player i pays sum_{j <= i} (c_j - c_{j-1})/(m - j)."""
    c = np.asarray(costs, dtype=np.float64)
    m = len(c)
    order = np.argsort(c, kind="stable")
    sorted_c = c[order]
    increments = np.diff(np.concatenate([[0.0], sorted_c])) / (m - np.arange(m))
    shares = np.cumsum(increments)
    expected = np.empty(m)
    expected[order] = -shares
    return (lambda s: -float(max((c[i] for i in s), default=0.0))), m, expected


def all_closed_form() -> dict[str, ClosedForm]:
    return {
        "additive": additive([0.5, -0.2, 1.3, 0.0, 0.7], offset=2.0),
        "symmetric": symmetric(6, quota=4, offset=0.3),
        "glove_1l_2r": glove(2),
        "glove_1l_4r": glove(4),
        "squared_sum": squared_sum([0.3, 0.1, 0.4, 0.2]),
        "unanimity": unanimity(6, {1, 3, 4}),
        "airport": airport([3.0, 1.0, 4.0, 1.0, 5.0]),
    }


class TableGame(Game):
    """A game given by a table of 2^m utilities indexed by bitmask (vectorized lookup, fast)."""

    def __init__(self, table: npt.ArrayLike) -> None:
        values = np.asarray(table, dtype=np.float64)
        m = int(np.log2(values.shape[0]))
        if values.shape != (2**m,):
            raise ValueError(f"table needs 2^m entries, got {values.shape}")
        super().__init__(m)
        self.table = values
        self.calls = 0

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        self.calls += members.shape[0]
        masks = members.astype(np.int64) @ (1 << np.arange(self.m, dtype=np.int64))
        return self.table[masks]


def table_of(utility: Utility, m: int) -> FloatArray:
    """The utilities of all 2^m coalitions of a callable game, indexed by bitmask."""
    rows = all_coalitions(m)
    return np.array([utility(frozenset(np.flatnonzero(r).tolist())) for r in rows], dtype=np.float64)


def scaled_into(table: FloatArray, r: float) -> FloatArray:
    """Affinely map a table into [0, r] (values scale by r / (max - min))."""
    lo, hi = float(table.min()), float(table.max())
    return (table - lo) * (r / (hi - lo))


def random_table(m: int, rng: np.random.Generator, r: float = 1.0) -> FloatArray:
    """Uniform random utilities in [0, r] for all 2^m coalitions."""
    return rng.uniform(0.0, r, size=2**m)


def sample_costs(seed: int, m: int, samples: int) -> FloatArray:
    """SampleMaxGame's costs: per player and sample a score in [0, 1); players differ in their mean
    (some near useless)."""
    rng = np.random.default_rng(seed)
    level = np.linspace(0.05, 0.6, m)[:, None]
    return np.clip(level + 0.35 * rng.random((m, samples)), 0.0, 1.0)


class SampleMaxGame(Game):
    """A game that is a mean over validation samples, split into folds as a round game is: sample s
    scores max_{i in S} c[i, s] (0 for the empty set), so each sample's game is an airport game with
    closed-form values and the value is their mean (`values`); `validation_noise` is the standard error of
    that mean over samples, what a fresh draw of the samples would move each value by."""

    def __init__(self, costs: FloatArray, folds: int = 8) -> None:
        self.costs = np.asarray(costs, dtype=np.float64)
        m, n = self.costs.shape
        super().__init__(m)
        self.fold, shares = fold_split(n, folds)
        self.store = ClassScores(m, 1, shares)
        per_sample = np.stack([-airport(list(self.costs[:, s]))[2] for s in range(n)], axis=1)
        self.per_sample = per_sample  # (m, n): each sample's values
        self.values = per_sample.mean(axis=1)
        self.validation_noise = per_sample.std(axis=1, ddof=1) / np.sqrt(n)

    def cell_scores(self) -> ClassScores:
        return self.store

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        members = np.asarray(members, dtype=bool)
        scores = np.where(members[:, :, None], self.costs[None, :, :], 0.0).max(axis=1)  # (B, n)
        n = self.costs.shape[1]
        cells = np.stack([scores[:, self.fold == f].sum(axis=1) / n for f in range(self.store.folds)], axis=1)
        self.store.add(bitmasks(members), cells)
        return np.asarray(cells.sum(axis=1), dtype=np.float64)
