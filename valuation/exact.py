"""Exact Shapley values by enumerating all 2^m coalitions in one batch."""

from __future__ import annotations

import logging
from fractions import Fraction
from math import factorial

import numpy as np

from fedsv.valuation.game import BoolMatrix, FloatArray, Game
from fedsv.valuation.result import ValuationResult

logger = logging.getLogger(__name__)

HARD_MAX_PLAYERS = 30
"""Beyond this the 2^m membership matrix alone does not fit in memory."""


def all_coalitions(m: int) -> BoolMatrix:
    """Membership matrix (2^m, m) whose row b is the coalition with bitmask b (bit i = player i)."""
    if not 1 <= m <= HARD_MAX_PLAYERS:
        raise ValueError(f"can enumerate coalitions of 1..{HARD_MAX_PLAYERS} players, got m={m}")
    masks = np.arange(2**m, dtype="<u4")
    bits = np.unpackbits(masks.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    return bits[:, :m].astype(bool)


def shapley_weights(m: int) -> FloatArray:
    """w[s] = s!(m-s-1)!/m! for s = 0..m-1: the weight of a marginal to a coalition of size s.

    Computed with exact fractions and rounded once, so large m does not lose precision.
    """
    return np.array(
        [float(Fraction(factorial(s) * factorial(m - s - 1), factorial(m))) for s in range(m)],
        dtype=np.float64,
    )


def shapley_from_table(members: BoolMatrix, utilities: FloatArray) -> FloatArray:
    """Shapley values from the utilities of ALL 2^m coalitions (rows of `members`, any order).

    s_i = sum_{S contains i} w[|S|-1] U(S) - sum_{S lacks i} w[|S|] U(S).
    """
    members = np.asarray(members, dtype=bool)
    m = members.shape[1]
    if members.shape[0] != 2**m:
        raise ValueError(f"need all {2**m} coalitions of {m} players, got {members.shape[0]} rows")
    sizes = members.sum(axis=1)
    w = np.append(shapley_weights(m), 0.0)  # w[m] multiplies nothing (no coalition of size m lacks i)
    w_in = w[np.maximum(sizes - 1, 0)] * utilities  # used only where the player is in S (|S| >= 1)
    w_out = w[sizes] * utilities
    values = np.empty(m, dtype=np.float64)
    for i in range(m):
        col = members[:, i]
        values[i] = float(np.sum(w_in[col]) - np.sum(w_out[~col]))
    return values


class ExactShapley:
    """Exact Shapley values: utilities of all 2^m coalitions, one batched evaluation."""

    method = "exact"

    def __init__(self, max_players: int = 20) -> None:
        if not 1 <= int(max_players) <= HARD_MAX_PLAYERS:
            raise ValueError(f"max_players must be in 1..{HARD_MAX_PLAYERS}, got {max_players}")
        self.max_players = int(max_players)

    def check(self, m: int) -> None:
        """Raise ValueError if a game of m players is too large to enumerate."""
        if m > self.max_players:
            raise ValueError(
                f"m={m} too large for exact (max_players={self.max_players}); "
                "use permutation or group_testing"
            )

    def run(self, game: Game) -> ValuationResult:
        m = game.m
        self.check(m)
        before = game.evaluations
        members = all_coalitions(m)
        utilities = game.utilities(members)
        values = shapley_from_table(members, utilities)
        empty, grand = float(utilities[0]), float(utilities[-1])
        logger.debug("exact Shapley over %d coalitions of %d players", members.shape[0], m)
        return ValuationResult(
            values=values,
            evaluations=game.evaluations - before,
            method=self.method,
            stderr=None,
            utility_empty=empty,
            utility_grand=grand,
        )
