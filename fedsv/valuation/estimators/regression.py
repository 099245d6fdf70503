"""Regression-adjusted Monte Carlo: a fitted surrogate of closed-form Shapley values as control variate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsv.valuation.estimators.border import Border, interior_sizes
from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.estimators.estimator import Outcome, StratifiedEstimator
from fedsv.valuation.estimators.strata import StratumMeans, sample_strata
from fedsv.valuation.games.game import BoolMatrix, FloatArray


@dataclass(frozen=True)
class Draws:
    """What a regression run drew: the border coalitions (all of their sizes) and the interior samples
    (rows, repeats kept: each is one sample)."""

    border: BoolMatrix
    rows: BoolMatrix


@dataclass(frozen=True)
class Fitted:
    """Values and their standard errors before the efficiency shift, and the surrogate kind fitted."""

    values: FloatArray
    stderr: FloatArray
    kind: str


PAIRS_SAMPLES_PER_PARAMETER = 2.0
"""surrogate="auto" fits the products z_i z_j only with at least this many coalitions per parameter."""

RIDGE = 1e-6
"""Ridge penalty, relative to the mean diagonal of the normal equations: keeps the fit defined when
the budget leaves fewer distinct coalitions than surrogate parameters."""


SURROGATES = ("sizes", "linear", "shares", "pairs")
"""Surrogate feature sets, each containing the one before: per-size intercepts; + membership x_i;
+ shares z_i = x_i/|S|; + products z_i z_j (a second-order expansion of U around the average delta)."""


def surrogate_features(members: BoolMatrix, kind: str = "shares") -> FloatArray:
    """Features of coalitions S (rows) for the surrogate `kind` (see SURROGATES)."""
    members = np.asarray(members, dtype=bool)
    count, m = members.shape
    sizes = members.sum(axis=1)
    blocks = [np.zeros((count, m + 1))]
    blocks[0][np.arange(count), sizes] = 1.0
    x = members.astype(np.float64)
    if kind != "sizes":
        blocks.append(x)
    share = x / np.maximum(sizes, 1)[:, None]
    if kind in ("shares", "pairs"):
        blocks.append(share)
    if kind == "pairs":
        upper = np.triu_indices(m)
        blocks.append(share[:, upper[0]] * share[:, upper[1]])
    return np.concatenate(blocks, axis=1)


def _share_values(m: int) -> tuple[float, float]:
    """Shapley values in the game z_j = x_j/|S|: (player j's, every other player's)."""
    own = float(np.sum(1.0 / np.arange(1, m + 1))) / m  # average of 1/(s+1) over s = 0..m-1
    return own, (1.0 / m - own) / (m - 1)  # the others share the rest of z_j(N) - z_j(empty) = 1/m


def _pair_values(m: int) -> tuple[float, float, float, float]:
    """Shapley values in z_i^2 = x_i/|S|^2 (i's, another's) and in z_i z_j, i != j (i's, another's)."""
    s = np.arange(m, dtype=np.float64)
    own_sq = float(np.sum(1.0 / (s + 1) ** 2)) / m
    other_sq = (1.0 / m**2 - own_sq) / (m - 1)
    if m < 3:
        return own_sq, other_sq, 1.0 / (2 * m**2), 0.0
    sizes = np.arange(2, m, dtype=np.float64)  # k joins S (without k) of size s holding both i and j
    both = sizes * (sizes - 1) / ((m - 1) * (m - 2))
    bystander = float(np.sum(both * (1.0 / (sizes + 1) ** 2 - 1.0 / sizes**2))) / m
    return own_sq, other_sq, (1.0 / m**2 - (m - 2) * bystander) / 2, bystander


def surrogate_shapley(coef: FloatArray, m: int, kind: str = "shares") -> FloatArray:
    """Exact Shapley values of the game f(S) = coef . surrogate_features(S, kind), in closed form: (m,),
    or (m, *columns) for coefficients (parameters, *columns) of several games.

    Size indicators form symmetric games: each player gets ([s = m] - [s = 0]) / m of theirs. x_i is
    additive. z_j = x_j/|S| gives j the average of 1/(s+1) over s = 0..m-1 and, by efficiency, every
    other player an equal share of the rest; the products z_i z_j are valued the same way (_pair_values).
    """
    values = np.zeros((m, *coef.shape[1:])) + (coef[m] - coef[0]) / m
    at = m + 1
    if kind != "sizes":
        values += coef[at : at + m]
        at += m
    if kind in ("shares", "pairs"):
        share = coef[at : at + m]
        own, other = _share_values(m)
        values += own * share + other * (share.sum(axis=0) - share)
        at += m
    if kind == "pairs":
        own_sq, other_sq, own_pair, bystander = _pair_values(m)
        for c, (i, j) in zip(coef[at:], zip(*np.triu_indices(m), strict=True), strict=True):
            if i == j:
                values += c * other_sq
                values[i] += c * (own_sq - other_sq)
            else:
                values += c * bystander
                values[[i, j]] += c * (own_pair - bystander)
    return np.asarray(values, dtype=np.float64)


def fit_surrogate(members: BoolMatrix, utilities: FloatArray, kind: str = "shares") -> FloatArray:
    """Least-squares coefficients of the surrogate, with a small relative ridge (utilities (rows,) or
    (rows, columns): one fit per column)."""
    features = surrogate_features(members, kind)
    gram = features.T @ features
    penalty = RIDGE * max(float(np.trace(gram)) / gram.shape[0], 1e-12)
    coef = np.linalg.solve(gram + penalty * np.eye(gram.shape[0]), features.T @ utilities)
    return np.asarray(coef, dtype=np.float64)


class RegressionMSR(StratifiedEstimator):
    """Regression-adjusted Monte Carlo (Witter et al. 2025) within a budget of distinct evaluations.

    s(U) = s(f) + s(U - f): f is a surrogate fitted to every coalition evaluated, whose Shapley values
    are exact (surrogate_shapley); the residual U - f is valued by maximum sample reuse over size
    strata (every evaluation updates every player's stratum of its size, as in stratified SVARM).
    The border sizes are evaluated exactly, the interior sampled. With budget >= 2^m the values are
    exact. Values are shifted to sum to U(all) - U(empty).

    cross_fit: fit the surrogate on half the samples and take residual means on the other half, both
    ways round, and average; removes the bias of reusing samples for the fit at some cost in variance.
    keep_draws: keep the coalitions drawn in extra["draws"], for values of other games on the same
    draws (by_column).
    """

    method = "regression"

    def __init__(
        self,
        budget: int,
        seed: int = 0,
        cross_fit: bool = True,
        surrogate: str = "auto",
        keep_draws: bool = False,
    ) -> None:
        super().__init__(budget, seed)
        self.keep_draws = keep_draws
        if surrogate != "auto" and surrogate not in SURROGATES:
            raise ValueError(f"unknown surrogate {surrogate!r}; choose auto or one of {list(SURROGATES)}")
        self.cross_fit = cross_fit
        self.surrogate = surrogate

    def surrogate_for(self, m: int, fitted_on: int) -> str:
        """The surrogate used: as asked, or under "auto" the products z_i z_j once the coalitions it is
        fitted on outnumber its parameters PAIRS_SAMPLES_PER_PARAMETER times, else the shares."""
        if self.surrogate != "auto":
            return self.surrogate
        pairs_parameters = (m + 1) + 2 * m + m * (m + 1) // 2
        return "pairs" if fitted_on >= PAIRS_SAMPLES_PER_PARAMETER * pairs_parameters else "shares"

    def from_border(self, budget: EvaluationBudget, border: Border) -> Outcome:
        rows, utilities = sample_strata(budget, interior_sizes(budget.game.m, border.sizes), self.rng())
        fitted = self.fitted(Draws(border.rows, rows), border.utilities, utilities, budget.game.resolution)
        extra: dict[str, Any] = {"cross_fit": self.cross_fit, "surrogate": fitted.kind}
        if self.keep_draws:
            extra["draws"] = Draws(border.rows, rows)
        return Outcome(fitted.values, fitted.stderr, samples=int(rows.shape[0]), extra=extra)

    def fitted(
        self,
        draws: Draws,
        border_utilities: FloatArray,
        utilities: FloatArray,
        resolution: float | None = None,
    ) -> Fitted:
        """The values from the coalitions drawn and their utilities, before the efficiency shift:
        utilities (rows,) for one game, or (rows, columns) for several on the same draws (each column's
        values are what a run on that game alone gives: the estimator is linear in the utilities).
        `resolution`: the games' Game.resolution, for the errors."""
        m, rows = draws.border.shape[1], draws.rows
        everything = np.arange(rows.shape[0])
        folds = np.array_split(everything, 2) if self.cross_fit else [everything]
        estimates, errors, kind = [], [], "shares"
        for k, held_out in enumerate(folds):
            fit_on = (
                np.concatenate([f for j, f in enumerate(folds) if j != k]) if self.cross_fit else held_out
            )
            kind = self.surrogate_for(m, draws.border.shape[0] + fit_on.shape[0])
            coef = fit_surrogate(
                np.concatenate([draws.border, rows[fit_on]]),
                np.concatenate([border_utilities, utilities[fit_on]]),
                kind,
            )
            strata = StratumMeans(m, utilities.shape[1:], resolution)
            strata.add_exact(draws.border, border_utilities - surrogate_features(draws.border, kind) @ coef)
            held = rows[held_out]
            strata.add(held, utilities[held_out] - surrogate_features(held, kind) @ coef)
            residual = strata.estimate()
            estimates.append(surrogate_shapley(coef, m, kind) + residual.values)
            errors.append(residual.stderr)
        stderr = np.sqrt(np.mean(np.square(errors), axis=0) / len(folds))
        return Fitted(np.mean(estimates, axis=0), stderr, kind)


def by_column(
    estimator: RegressionMSR,
    draws: Draws,
    border: FloatArray,
    utilities: FloatArray,
    resolution: float | None = None,
) -> Fitted:
    """The values and standard errors of several games (m, columns) that `estimator` would give, run on
    each alone with the draws it made on their sum (extra["draws"] of a keep_draws run), in one pass:
    `border` and `utilities` are the games' utilities of the draws' border and sampled coalitions
    (rows, columns), on a lattice of step `resolution` where not None. Shifted, per game, to sum to its
    U(all) - U(empty)."""
    fitted = estimator.fitted(draws, border, utilities, resolution)
    sizes = draws.border.sum(axis=1)
    gain = border[sizes == draws.border.shape[1]][0] - border[sizes == 0][0]
    m = draws.border.shape[1]
    values = np.asarray(fitted.values + (gain - fitted.values.sum(axis=0)) / m, dtype=np.float64)
    return Fitted(values, fitted.stderr, fitted.kind)
