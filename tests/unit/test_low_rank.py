"""Stacked low-rank fits: each matrix's fit as it would be alone, and the closed-form row solves."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.accounting.low_rank import als, solve_rows


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_the_row_solves_are_the_ridge_least_squares_solutions(rank: int) -> None:
    rng = np.random.default_rng(rank)
    values, factor = rng.normal(size=(4, 6, 9)), rng.normal(size=(4, 9, rank))
    mask = (rng.random((4, 6, 9)) < 0.6).astype(np.float64)
    ridge = rng.uniform(0.01, 1.0, 4)
    got = solve_rows(values, mask, factor, ridge)
    for r in range(4):
        for t in range(6):
            design = factor[r] * np.sqrt(mask[r, t])[:, None]
            gram = design.T @ design + ridge[r] * np.eye(rank)
            expected = np.linalg.solve(gram, design.T @ (values[r, t] * np.sqrt(mask[r, t])))
            np.testing.assert_allclose(got[r, t], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_a_stack_of_fits_gives_each_matrix_its_own_fit(rank: int) -> None:
    """Fitted together, matrices that stop at different steps (an exactly low-rank one within a few,
    noisy ones later) each get the fit they get alone: a matrix that is done stays as it was."""
    rng = np.random.default_rng(10 + rank)
    exact = rng.normal(size=(10, rank)) @ rng.normal(size=(rank, 12))
    values = np.concatenate([exact[None], rng.normal(size=(5, 10, 12))])
    mask = rng.random(values.shape) < 0.7
    mask[0] = True
    ridge = np.full(values.shape[0], 1e-6)
    together = als(values, mask, rank, ridge, seed=0)
    for r in range(values.shape[0]):
        alone = als(values[r : r + 1], mask[r : r + 1], rank, ridge[r : r + 1], seed=0)[0]
        np.testing.assert_allclose(together[r], alone, rtol=0, atol=1e-12)
    np.testing.assert_allclose(together[0], exact, atol=1e-4)  # a fully observed low-rank matrix is found


def test_values_all_zero_fit_to_zero_at_any_rank() -> None:
    """A matrix of zeros (a run whose every value was 0) puts no scale on the penalty, and the row
    systems of a rank above the matrix's own are singular to rounding: the fit is still all zeros."""
    from fedsv.valuation.accounting.completion import Model, fit

    for shape in ((1, 1), (2, 5), (3, 4)):
        for rank in (1, 2, 3):
            out = fit(np.zeros(shape), np.ones(shape, dtype=bool), Model("low rank", rank, 1e-6))
            assert np.array_equal(out, np.zeros(shape))
