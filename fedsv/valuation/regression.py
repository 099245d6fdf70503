"""Regression-adjusted Monte Carlo: a fitted surrogate of closed-form Shapley values as control variate."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.border import Border, interior_sizes
from fedsv.valuation.budget import EvaluationBudget
from fedsv.valuation.estimator import Outcome, StratifiedEstimator
from fedsv.valuation.game import BoolMatrix, FloatArray
from fedsv.valuation.strata import StratumMeans, sample_strata

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
    """Exact Shapley values of the game f(S) = coef . surrogate_features(S, kind), in closed form.

    Size indicators form symmetric games: each player gets ([s = m] - [s = 0]) / m of theirs. x_i is
    additive. z_j = x_j/|S| gives j the average of 1/(s+1) over s = 0..m-1 and, by efficiency, every
    other player an equal share of the rest; the products z_i z_j are valued the same way (_pair_values).
    """
    values = np.full(m, (coef[m] - coef[0]) / m)
    at = m + 1
    if kind != "sizes":
        values += coef[at : at + m]
        at += m
    if kind in ("shares", "pairs"):
        share = coef[at : at + m]
        own, other = _share_values(m)
        values += own * share + other * (share.sum() - share)
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
    """Least-squares coefficients of the surrogate, with a small relative ridge."""
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
    """

    method = "regression"

    def __init__(self, budget: int, seed: int = 0, cross_fit: bool = True, surrogate: str = "auto") -> None:
        super().__init__(budget, seed)
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
        m = budget.game.m
        rows, utilities = sample_strata(budget, interior_sizes(m, border.sizes), self.rng())
        everything = np.arange(rows.shape[0])
        folds = np.array_split(everything, 2) if self.cross_fit else [everything]
        estimates, errors = [], []
        for k, held_out in enumerate(folds):
            fit_on = (
                np.concatenate([f for j, f in enumerate(folds) if j != k]) if self.cross_fit else held_out
            )
            kind = self.surrogate_for(m, border.rows.shape[0] + fit_on.shape[0])
            coef = fit_surrogate(
                np.concatenate([border.rows, rows[fit_on]]),
                np.concatenate([border.utilities, utilities[fit_on]]),
                kind,
            )
            strata = StratumMeans(m)
            strata.add_exact(border.rows, border.utilities - surrogate_features(border.rows, kind) @ coef)
            held = rows[held_out]
            strata.add(held, utilities[held_out] - surrogate_features(held, kind) @ coef)
            residual = strata.estimate()
            estimates.append(surrogate_shapley(coef, m, kind) + residual.values)
            errors.append(residual.stderr)
        return Outcome(
            np.mean(estimates, axis=0),
            np.sqrt(np.mean(np.square(errors), axis=0) / len(folds)),
            samples=int(rows.shape[0]),
            extra={"cross_fit": self.cross_fit, "surrogate": kind},
        )
