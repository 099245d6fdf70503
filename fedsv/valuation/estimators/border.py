"""Border strata: the few smallest and largest coalition sizes, evaluated once and exactly, not sampled."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb

import numpy as np

from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.games.game import BoolMatrix, FloatArray

BORDER_SHARE = 0.5
"""At most this share of an estimator's budget goes to whole border strata; the rest is sampled."""


def coalitions_of_size(m: int, size: int) -> BoolMatrix:
    """All C(m, size) coalitions of `size` players, as membership rows in lexicographic order."""
    if not 0 <= size <= m:
        raise ValueError(f"no coalitions of size {size} among {m} players")
    rows = np.zeros((comb(m, size), m), dtype=bool)
    for k, members in enumerate(combinations(range(m), size)):
        rows[k, list(members)] = True
    return rows


def border_sizes(m: int, budget: int, share: float = BORDER_SHARE) -> list[int]:
    """The sizes evaluated exactly: 0 and m always, then the pairs (1, m-1), (2, m-2), ... while the
    coalitions of all chosen sizes stay within `share` of `budget` (or within the whole budget for
    sizes 0, 1, m-1, m, which every estimator here needs); every size when all 2^m coalitions fit.
    Sorted, without duplicates."""
    if 2**m <= budget:
        return list(range(m + 1))
    chosen = {0, m}
    total = 1 if m == 0 else 2
    depth = 1
    while depth <= m - depth:
        pair = {depth, m - depth} - chosen
        extra = sum(comb(m, s) for s in pair)
        cap = budget if depth == 1 else share * budget
        if total + extra > cap:
            break
        chosen |= pair
        total += extra
        depth += 1
    return sorted(chosen)


def border_rows(m: int, sizes: list[int]) -> BoolMatrix:
    """Every coalition whose size is in `sizes`."""
    return np.concatenate([coalitions_of_size(m, s) for s in sizes], axis=0)


def interior_sizes(m: int, border: list[int]) -> list[int]:
    """The sizes not covered by `border`: the strata an estimator samples."""
    return [s for s in range(m + 1) if s not in set(border)]


@dataclass(frozen=True)
class Border:
    """The border coalitions (every coalition of `sizes`), evaluated exactly, and U(empty), U(all)."""

    sizes: list[int]
    rows: BoolMatrix
    utilities: FloatArray
    empty: float
    grand: float


def evaluate_border(budget: EvaluationBudget) -> Border:
    """Evaluate every coalition of the border sizes for the budget's limit (border_sizes)."""
    m = budget.game.m
    sizes = border_sizes(m, budget.limit)
    rows = border_rows(m, sizes)
    utilities = budget.utilities(rows)
    sized = rows.sum(axis=1)
    empty, grand = float(utilities[sized == 0][0]), float(utilities[sized == m][0])
    return Border(sizes, rows, utilities, empty, grand)
