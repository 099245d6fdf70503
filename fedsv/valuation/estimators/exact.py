"""Exact Shapley values by enumerating all 2^m coalitions in one batch."""

from __future__ import annotations

import logging
from fractions import Fraction
from math import factorial

import numpy as np

from fedsv.valuation.estimators.estimator import Estimator, Outcome, Settings
from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game, members_of

logger = logging.getLogger(__name__)

HARD_MAX_PLAYERS = 30
"""Beyond this the 2^m membership matrix alone does not fit in memory."""

ENUMERATION_CHUNK = 2**20
"""Coalitions handed to the game per call when enumerating all 2^m (bounds the host's membership rows)."""


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


def shapley_from_dense(table: FloatArray) -> FloatArray:
    """Shapley values from a dense table of all 2^m utilities, table[b] = U(coalition with bitmask b);
    a table (2^m, K) holds K games (a round's validation cells) and gives their values as (m, K).

    s_i = sum_S c_i(S) U(S) with c_i(S) = w[|S|-1] if i is in S, else -w[|S|]; so
    s_i = sum_{S contains i} (w[|S|-1] + w[|S|]) U(S) - sum_S w[|S|] U(S): one pass over half the
    table per player, as a strided view (no membership matrix).
    """
    table = np.asarray(table, dtype=np.float64)
    m = int(table.shape[0]).bit_length() - 1
    if m < 1 or table.shape[0] != 2**m or table.ndim > 2:
        raise ValueError(f"need a table of 2^m utilities, got shape {table.shape}")
    if not np.all(np.isfinite(table)):
        raise ValueError("the utility table has missing or non-finite entries")
    w = np.append(shapley_weights(m), 0.0)  # w[m] = 0: no coalition of size m lacks a player
    sizes = np.zeros(2**m, dtype=np.int64)
    for i in range(m):
        sizes.reshape(-1, 2, 2**i)[:, 1, :] += 1
    games = table.reshape(2**m, -1)
    weighted_out = w[sizes][:, None] * games
    both = (w[np.maximum(sizes - 1, 0)] + w[sizes])[:, None] * games
    common = weighted_out.sum(axis=0)
    values = np.stack(
        [both.reshape(-1, 2, 2**i, games.shape[1])[:, 1].sum(axis=(0, 1)) - common for i in range(m)]
    )
    return values[:, 0] if table.ndim == 1 else values


class ExactShapley(Estimator):
    """Exact Shapley values: utilities of all 2^m coalitions in bitmask order, ENUMERATION_CHUNK per call."""

    method = "exact"

    def __init__(self, max_players: int = 20) -> None:
        if not 1 <= int(max_players) <= HARD_MAX_PLAYERS:
            raise ValueError(f"max_players must be in 1..{HARD_MAX_PLAYERS}, got {max_players}")
        self.max_players = int(max_players)

    @classmethod
    def configured(cls, evaluations: int, settings: Settings) -> Estimator:
        return cls(settings.max_exact_players)

    @classmethod
    def planned_evaluations(cls, m: int, budget: int, settings: Settings) -> int:
        return 2**m

    def check(self, m: int) -> None:
        """Raise ValueError if a game of m players is too large to enumerate."""
        if m > self.max_players:
            raise ValueError(
                f"m={m} too large for exact (max_players={self.max_players}); "
                "use permutation or group_testing"
            )

    def single_player(self, game: Game) -> Outcome:
        return self.estimate(game)

    def estimate(self, game: Game) -> Outcome:
        m = game.m
        self.check(m)
        game.use_dense_table()
        total = 2**m
        for start in range(0, total, ENUMERATION_CHUNK):
            game.utilities(members_of(np.arange(start, min(total, start + ENUMERATION_CHUNK)), m))
        table = game.dense_table()
        assert table is not None, "use_dense_table() gives the game a table"
        logger.debug("exact Shapley over %d coalitions of %d players", total, m)
        return Outcome(shapley_from_dense(table), None, float(table[0]), float(table[-1]))
