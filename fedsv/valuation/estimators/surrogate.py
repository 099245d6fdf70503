"""A sampler corrected by a cheap surrogate of the game: phi(U) = phi(G) + phi(U - G), only U - G sampled.

The Shapley value is linear in the utility, so for any game G on the same players phi(U) = phi(G) +
phi(U - G). When G is cheap to evaluate and follows U closely (a round's model linearized around w_t:
linearized.py), phi(G) is computed exactly (beyond 16 players, sampled over 16,384 of its coalitions,
at next to no cost) and only the residual game U - G is sampled on U's costly coalitions. The estimate stays
unbiased whatever G is, since phi(G) is exact or unbiased and the residual's sampler is; a surrogate
that follows U only changes how fast the error falls. Its stated error is the two errors added in
quadrature (the two samples are drawn with different seeds, independently).

The residual splits by validation cell like U does (ResidualScores: U's cells less G's), so a noise
target (noise_target.py) and the split by label and fold (by_class.py) read it as they read a round
game; the surrogate's own values per cell (SurrogateValues.cells) add back what the residual lacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsv.valuation.estimators.estimator import Estimator, Outcome, Settings
from fedsv.valuation.estimators.exact import ExactShapley, shapley_from_dense
from fedsv.valuation.estimators.regression import RegressionMSR, by_column
from fedsv.valuation.estimators.result import ValuationResult
from fedsv.valuation.estimators.target import ToTarget, first_allowance
from fedsv.valuation.games.game import BoolMatrix, CellScores, FloatArray, Game, MaskArray, bitmasks

SURROGATE_EXACT_PLAYERS = 16
"""Up to this many players the surrogate's values are exact: all 2^m of its (cheap) coalitions."""

KEEP_BELOW = 0.9
"""The pilot keeps the surrogate where it makes the median stated error at most this share of the
plain sampler's: a surrogate that barely helps is not worth its own forward passes."""

SURROGATE_SAMPLES = 2**14
"""Beyond that, the surrogate's values are sampled (regression) with this many of its coalitions: about
a second for a round's linearized model at m = 20, and an error near 1e-4 on an accuracy."""


class ResidualScores:
    """U's per-cell utilities less the surrogate's: the CellScores that fold and label games
    (class_scores.CellGame) read, for the residual game U - G."""

    def __init__(self, game: CellScores, surrogate: CellScores) -> None:
        if (game.m, game.width) != (surrogate.m, surrogate.width):
            raise ValueError("the surrogate must split its scores into the game's validation cells")
        self.game, self.surrogate = game, surrogate
        self.shares, self.m, self.classes = game.shares, game.m, game.classes
        self.folds, self.width = game.folds, game.width

    def get(self, masks: MaskArray, cells: slice | list[int]) -> FloatArray:
        return self.game.get(masks, cells) - self.surrogate.get(masks, cells)

    def table(self) -> FloatArray | None:
        a, b = self.game.table(), self.surrogate.table()
        return None if a is None or b is None else a - b

    def label(self, label: int) -> slice:
        return self.game.label(label)

    def fold(self, fold: int) -> slice:
        return self.game.fold(fold)


class ResidualGame(Game):
    """U - G on U's players (G: `cheap`): every evaluation evaluates both; U's are the costly ones."""

    def __init__(self, game: Game, surrogate: Game) -> None:
        if surrogate.m != game.m:
            raise ValueError(f"the surrogate has {surrogate.m} players, the game {game.m}")
        super().__init__(game.m)
        self.game, self.cheap = game, surrogate
        self.computes_on_cpu = game.computes_on_cpu
        same = game.resolution is not None and game.resolution == surrogate.resolution
        self.resolution = game.resolution if same else None  # U - G on U's lattice where G shares it
        self._seen: list[tuple[FloatArray, FloatArray]] = []  # (U, G) of every batch evaluated

    def explained(self) -> float:
        """The share of U's variance over the coalitions evaluated that G accounts for, 1 - var(U - G) /
        var(U): 0.85 leaves the sampler 15% of the spread; NaN before two coalitions differ."""
        if not self._seen:
            return float("nan")
        u, g = (np.concatenate(parts) for parts in zip(*self._seen, strict=True))
        total = float(np.var(u))
        return float(1.0 - np.var(u - g) / total) if total > 0 else float("nan")

    def prepare(self) -> None:
        self.game.prepare()
        self.cheap.prepare()

    def cell_scores(self) -> CellScores | None:
        game, surrogate = self.game.cell_scores(), self.cheap.cell_scores()
        if game is None or surrogate is None:
            return None
        return ResidualScores(game, surrogate)

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        u, g = self.game.utilities(members), self.cheap.utilities(members)
        self._seen.append((u, g))
        return u - g


class GameView(Game):
    """`game`'s utilities under a fresh memo: a sampler run on it draws what it would on a fresh game,
    and every coalition `game` already evaluated costs nothing (a replay of the same draws)."""

    def __init__(self, game: Game) -> None:
        super().__init__(game.m)
        self.game = game
        self.computes_on_cpu, self.resolution = game.computes_on_cpu, game.resolution

    def prepare(self) -> None:
        self.game.prepare()

    def cell_scores(self) -> CellScores | None:
        return self.game.cell_scores()

    def _evaluate(self, members: BoolMatrix) -> FloatArray:
        return self.game.utilities(members)


@dataclass(frozen=True)
class SurrogateValues:
    """The surrogate game's values: overall (m,), their standard errors (None: exact), per validation
    cell (m, width) where the surrogate splits by cell, and what they cost."""

    values: FloatArray
    stderr: FloatArray | None
    cells: FloatArray | None
    evaluations: int
    budget: int | None = None  # a sampled surrogate's regression budget (seeded settings.seed + 1)
    label_stderr: FloatArray | None = None  # a sampled surrogate's errors per validation label (m, classes)


def surrogate_values(surrogate: Game, settings: Settings) -> SurrogateValues:
    """phi(G): exact over all 2^m coalitions up to SURROGATE_EXACT_PLAYERS, else regression with
    SURROGATE_SAMPLES coalitions (seeded apart from the residual's draws). Per validation cell: read off
    the exact table, or the regression's values of each cell's game on the same draws, in one pass
    (regression.by_column: what a run on each cell's game alone would give)."""
    m, before = surrogate.m, surrogate.evaluations
    store = surrogate.cell_scores()
    if m <= SURROGATE_EXACT_PLAYERS:
        exact = ExactShapley(max(m, settings.max_exact_players)).run(surrogate)
        table = store.table() if store is not None else None
        cells = shapley_from_dense(table) if table is not None else None
        return SurrogateValues(exact.values, None, cells, surrogate.evaluations - before)
    budget = min(2**m, SURROGATE_SAMPLES)
    sampler = RegressionMSR(budget, seed=settings.seed + 1, keep_draws=True)
    sampled = sampler.run(GameView(surrogate))  # a fresh memo: the draws do not depend on the pilot's
    if store is None:
        return SurrogateValues(sampled.values, sampled.stderr, None, surrogate.evaluations - before, budget)
    draws, step = sampled.extra["draws"], surrogate.resolution

    def by_cell(rows: BoolMatrix) -> FloatArray:  # (rows, width): G's utility per validation cell
        masks = bitmasks(rows)
        return np.stack([store.get(masks, [cell]) for cell in range(store.width)], axis=1)

    def by_label(cells: FloatArray) -> FloatArray:  # cells are label * folds + fold
        return cells.reshape(cells.shape[0], store.classes, -1).sum(axis=2)

    border, rows = by_cell(draws.border), by_cell(draws.rows)
    per_cell = by_column(sampler, draws, border, rows, step)
    per_label = by_column(sampler, draws, by_label(border), by_label(rows), step)
    return SurrogateValues(
        sampled.values,
        sampled.stderr,
        per_cell.values,
        surrogate.evaluations - before,
        budget,
        per_label.stderr,
    )


def surrogate_on(info: dict[str, Any], cells: slice | list[int]) -> FloatArray:
    """A used surrogate's values on some validation cells (extra["control_variate"] of a corrected
    result), summed over them (m,)."""
    return np.asarray(info["cells"][:, cells].sum(axis=1), dtype=np.float64)


class SurrogateCorrected(Estimator):
    """`estimator` (a sampler, or a ToTarget around one) run on the residual U - G, plus G's own values.

    G is `surrogate`, or the game's own (Game.surrogate(): a round game's linearized model); a game
    without one is valued by `estimator` alone. Around a ToTarget, the sampler's first attempt is a
    pilot, run on the residual and replayed on U itself (the same draws, no further evaluation): the
    surrogate is kept only where it makes the median stated error at most KEEP_BELOW of the plain
    sampler's, and then the noise target
    reads the values per validation fold with G's added back. The result's method is the estimator's;
    extra["control_variate"] says whether G was used and why, what it explained and cost."""

    def __init__(self, estimator: Estimator, settings: Settings, surrogate: Game | None = None) -> None:
        self.estimator, self.settings, self.surrogate = estimator, settings, surrogate

    def run(self, game: Game) -> ValuationResult:
        result = super().run(game)
        info = result.extra.get("control_variate")  # none for one player: U({0}) - U(empty), exact
        return dataclasses.replace(result, method="exact" if info is None else info["method"])

    def estimate(self, game: Game) -> Outcome:
        surrogate = self.surrogate if self.surrogate is not None else game.surrogate()
        if surrogate is None:
            return self._plain(game, "the game has no surrogate")
        if surrogate.m != game.m:
            raise ValueError(f"the surrogate has {surrogate.m} players, the game {game.m}")
        kept, why = self._pilot(game, surrogate)
        if not kept:
            return self._plain(game, why)
        phi_g = surrogate_values(surrogate, self.settings)  # first: a noise target reads them per fold
        info = {
            "used": True,
            "reason": why,
            "values": phi_g.values,
            "stderr": phi_g.stderr,
            "evaluations": phi_g.evaluations,
            "cells": phi_g.cells,  # (m, width) or None: G's values per validation cell
            "budget": phi_g.budget,
            "label_stderr": phi_g.label_stderr,  # (m, classes) where G's values are sampled, else None
            "game": surrogate,  # G, its cell scores: what the residual's split by label reads (by_class)
        }
        residual_game = ResidualGame(game, surrogate)
        residual = self._with_base(info, surrogate).run(residual_game)
        info = {**info, "method": residual.method, "explained": residual_game.explained()}
        empty, grand = game.empty_and_grand()
        values, stderr = phi_g.values + residual.values, _quadrature(residual.stderr, phi_g.stderr)
        extra = {**residual.extra, "control_variate": info}
        return Outcome(values, stderr, empty, grand, residual.samples, extra)

    def _plain(self, game: Game, why: str) -> Outcome:
        """The estimator alone, on a view of the game (a pilot's coalitions are not evaluated again)."""
        result = self.estimator.run(GameView(game))
        info = {"used": False, "reason": why, "method": result.method}
        return Outcome.of(result, {**result.extra, "control_variate": info})

    def _pilot(self, game: Game, surrogate: Game) -> tuple[bool, str]:
        """Whether to keep the surrogate: the sampler's first attempt on the residual against the same
        draws on U (for a ToTarget; any other estimator keeps it), and why in words."""
        if not isinstance(self.estimator, ToTarget):
            return True, "a surrogate was given"
        allowance = min(first_allowance(game.m), self.estimator.cap)
        if allowance >= 2**game.m:
            return True, "the first attempt is all coalitions"
        pilot = self.estimator.sampler.configured(allowance, self.estimator.settings)
        residual = ResidualGame(game, surrogate)
        corrected, plain = pilot.run(residual).stderr, pilot.run(GameView(game)).stderr
        if corrected is None or plain is None or not (np.all(np.isfinite(corrected)) and np.all(plain > 0)):
            return False, "the pilot's errors are not known"
        ratio = float(np.median(corrected / plain))
        explained = residual.explained()
        words = f"the surrogate explained {explained:.0%} of the pilot's spread, errors x{ratio:.2f}"
        keep = ratio <= KEEP_BELOW
        return keep, words if keep else f"{words}: dropped"

    def _with_base(self, info: dict[str, Any], surrogate: Game) -> Estimator:
        """The estimator, told the surrogate's values per validation fold (a noise target reads the
        folds' spread of U's values, not of the residual's)."""
        store = surrogate.cell_scores()
        if (
            not isinstance(self.estimator, ToTarget)
            or info["cells"] is None
            or store is None
            or store.folds < 2
        ):
            return self.estimator
        folds = np.stack([surrogate_on(info, store.fold(f)) for f in range(store.folds)], axis=1)
        return self.estimator.with_fold_base(folds)


def _quadrature(a: FloatArray | None, b: FloatArray | None) -> FloatArray | None:
    """Two independent errors together (None: exact)."""
    if a is None and b is None:
        return None
    return np.asarray(np.sqrt(np.square(0.0 if a is None else a) + np.square(0.0 if b is None else b)))


__all__ = [
    "GameView",
    "ResidualGame",
    "ResidualScores",
    "SurrogateCorrected",
    "SurrogateValues",
    "surrogate_on",
    "surrogate_values",
]
