"""Values per validation label and per validation fold: the round's estimator replayed on each label's
and each fold's game, at no evaluation.

A round game splits into per-cell games (class_scores.CellGame) whose utilities sum to its own. The
estimator that valued the round is run again on each label's and each fold's game, with the same seed
and the same budgets in the same order, so it asks for exactly the coalitions the round game
evaluated; every estimator here but GTG-Shapley is linear in the utilities of the coalitions it saw,
so the labels' values (and the folds') add up to the participants' values (to float rounding). GTG
truncates permutations on the utilities it sees, which is not linear: a round valued with it is not
split. Where the round was valued exactly, each label is also split by fold, so that a label's value
has a validation error of its own (valuation_noise.py); a sampled round's label values carry the
estimator's error only (replaying a sampler on every cell would cost labels x folds replays).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.estimators.api import Plan, make_estimator
from fedsv.valuation.estimators.exact import ExactShapley, shapley_from_dense
from fedsv.valuation.estimators.loo import LeaveOneOut
from fedsv.valuation.estimators.methods import REGISTRY
from fedsv.valuation.estimators.noise_target import fold_stderr
from fedsv.valuation.estimators.result import ValuationResult
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.estimators.surrogate import ResidualScores, surrogate_on
from fedsv.valuation.games.class_scores import CellGame
from fedsv.valuation.games.game import CellScores, FloatArray, Game

NOT_LINEAR = ("gtg", "random")
"""Methods whose values are not a linear function of the utilities they saw."""


@dataclass(frozen=True)
class ClassValues:
    """Per participant (rows) and validation label (columns): values and their standard errors (the
    estimator's); `validation`: the labels' validation errors (valuation_noise.fold_stderr), None where
    the round was sampled."""

    values: FloatArray
    stderr: FloatArray
    validation: FloatArray | None = None


@dataclass(frozen=True)
class FoldValues:
    """Per participant (rows) and validation fold (columns): its FedSV and LOO on that fold's samples
    (they add up to its values) and each fold's share of the validation samples."""

    fedsv: FloatArray
    loo: FloatArray
    shares: FloatArray

    @property
    def folds(self) -> int:
        return int(self.shares.shape[0])


@dataclass(frozen=True)
class SplitValues:
    """A round's values split by label and by fold (either None where the round does not split)."""

    classes: ClassValues | None
    folds: FoldValues | None


def split_values(game: Game, chosen: Plan, spec: ValuationSpec, result: ValuationResult) -> SplitValues:
    """The values per label and per fold of a round `result` valued by `chosen`; None where the game
    does not split or the method is not linear."""
    store = game.cell_scores()
    if store is None or chosen.method in NOT_LINEAR:
        return SplitValues(None, None)
    table = store.table() if result.method == "exact" else None  # planned exact, or a sampler finished exact
    if table is not None:
        return _exact_split(store, table)
    surrogate = result.extra.get("control_variate") or {}
    sampled: CellScores = store  # what the sampler sampled: U, or a surrogate's residual U - G
    if surrogate.get("used"):
        if surrogate["cells"] is None:  # a surrogate that does not split by cell: the residual cannot
            return SplitValues(None, None)
        sampled = ResidualScores(store, surrogate["game"].cell_scores())

    def replayed(cells: list[slice]) -> tuple[FloatArray, list[ValuationResult]]:
        """The sampler's values on each of `cells` (m, len(cells)), with G's own added back."""
        runs = [_replay(CellGame(sampled, c, game.resolution), chosen, spec, result) for c in cells]
        values = np.stack([r.values for r in runs], axis=1)
        if surrogate.get("used"):
            values += np.stack([surrogate_on(surrogate, c) for c in cells], axis=1)
        return values, runs

    label_values, labels = replayed([store.label(c) for c in range(store.classes)])
    zeros = np.zeros(game.m)
    label_stderr = np.stack([zeros if r.stderr is None else r.stderr for r in labels], axis=1)
    if surrogate.get("used") and surrogate.get("label_stderr") is not None:  # G's own, independent
        label_stderr = np.sqrt(np.square(label_stderr) + np.square(surrogate["label_stderr"]))
    classes = ClassValues(label_values, label_stderr)
    if store.folds == 1:
        return SplitValues(classes, None)
    fold_games = [CellGame(store, store.fold(f)) for f in range(store.folds)]
    fold_fedsv = (result.extra.get("target") or {}).get("fold_values")  # a noise target replayed them
    if fold_fedsv is None:
        fold_fedsv = replayed([store.fold(f) for f in range(store.folds)])[0]
    loo = np.stack([LeaveOneOut().run(g).values for g in fold_games], axis=1)
    return SplitValues(classes, FoldValues(fold_fedsv, loo, store.shares))


def _exact_split(store: CellScores, table: FloatArray) -> SplitValues:
    """An exactly valued round split by every (label, fold) cell at once, from its table of utilities:
    one pass over the table for every cell's game (exact.shapley_from_dense), LOO read off it."""
    m, folds = store.m, store.folds
    cells = shapley_from_dense(table).reshape(m, store.classes, folds)
    grand = table[-1]
    without = table[(2**m - 1) ^ (1 << np.arange(m))]  # N minus each player, (m, width)
    loo = (grand[None, :] - without).reshape(m, store.classes, folds)
    validation = fold_stderr(cells, store.shares) if folds > 1 else None
    classes = ClassValues(cells.sum(axis=2), np.zeros((m, store.classes)), validation)
    if folds == 1:
        return SplitValues(classes, None)
    return SplitValues(classes, FoldValues(cells.sum(axis=1), loo.sum(axis=1), store.shares))


def _replay(part: Game, chosen: Plan, spec: ValuationSpec, result: ValuationResult) -> ValuationResult:
    """The estimator of `result` on one cell's game: a run to a target is replayed attempt by attempt,
    one that finished exact is exact on the cell too (where the store is too large for a table)."""
    target = result.extra.get("target")
    if result.method == "exact":
        return ExactShapley(max(part.m, spec.max_exact_players)).run(part)
    if target is None:
        return make_estimator(chosen, spec).run(part)
    sampler, settings = REGISTRY[chosen.method], dataclasses.replace(spec.settings(), capped=True)
    replayed = result
    for allowance in target["allowances"]:
        replayed = sampler.configured(allowance, settings).run(part)
    return replayed


__all__ = ["ClassValues", "FoldValues", "SplitValues", "split_values"]
