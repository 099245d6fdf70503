"""Low-rank fits A B^T of partly observed matrices by alternating ridge least squares, many at once.

The completion fits one round-by-member matrix per simulated rerun (200 of them per uncertainty) and
one per cross-validation fold. Each fit is a few hundred alternating steps on a matrix of about
10 x 20, so a loop over fits is all call overhead: the fits here run stacked, (R, T, N), each
matrix with its own mask, penalty and stopping step, and each gives the fit it would give alone.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

ITERATIONS = 200
TOLERANCE = 1e-7
"""ALS stops when the fit moves less than this, relative to its size (each matrix on its own)."""


def solve_rows(values: FloatArray, mask: FloatArray, factor: FloatArray, ridge: FloatArray) -> FloatArray:
    """For every matrix r and row t at once, (R, T, k):
    argmin_a sum_i mask[r, t, i] (values[r, t, i] - a . factor[r, i])^2 + ridge[r] |a|^2."""
    rank = factor.shape[-1]
    moment = (mask * values) @ factor
    if rank == 1:  # the 1 x 1 system in closed form
        return np.asarray(moment / (mask @ np.square(factor) + ridge[:, None, None]), dtype=np.float64)
    outer = (factor[..., :, None] * factor[..., None, :]).reshape(*factor.shape[:-1], rank * rank)
    gram = (mask @ outer).reshape(*mask.shape[:-1], rank, rank) + ridge[:, None, None, None] * np.eye(rank)
    if rank == 2:  # Cramer's rule (the gram is positive definite: ridge > 0)
        g00, g01, g10, g11 = gram[..., 0, 0], gram[..., 0, 1], gram[..., 1, 0], gram[..., 1, 1]
        determinant = g00 * g11 - g01 * g10
        first = (g11 * moment[..., 0] - g01 * moment[..., 1]) / determinant
        second = (g00 * moment[..., 1] - g10 * moment[..., 0]) / determinant
        return np.stack([first, second], axis=-1)
    try:
        return np.asarray(np.linalg.solve(gram, moment[..., None])[..., 0], dtype=np.float64)
    except np.linalg.LinAlgError:  # a penalty lost to rounding (values all 0): the least-norm solution
        return np.asarray((np.linalg.pinv(gram) @ moment[..., None])[..., 0], dtype=np.float64)


def _start(values: FloatArray, mask: npt.NDArray[np.bool_], rank: int, seed: int) -> FloatArray:
    """Each matrix's right factor (R, N, rank) from the top singular vectors of its zero-filled matrix
    (spectral initialization: from a random start ALS can stall with a factor blowing up), padded
    with seeded noise where there are fewer singular vectors than the rank."""
    share = np.maximum(mask.mean(axis=(1, 2)), 1e-12)
    _, singular, right = np.linalg.svd(
        np.where(mask, values, 0.0) / share[:, None, None], full_matrices=False
    )
    b = np.swapaxes(right[:, :rank], 1, 2) * np.sqrt(singular[:, None, :rank])
    if b.shape[2] < rank:
        pad = np.random.default_rng(seed).normal(scale=1e-3, size=(b.shape[1], rank - b.shape[2]))
        b = np.concatenate([b, np.broadcast_to(pad, (b.shape[0], *pad.shape))], axis=2)
    return np.asarray(b, dtype=np.float64)


def als(
    values: FloatArray, mask: npt.NDArray[np.bool_], rank: int, ridge: FloatArray, seed: int
) -> FloatArray:
    """Each matrix's rank-`rank` fit A B^T of its masked entries with penalty ridge[r] (values and
    mask (R, T, N)); a column or row with no observed entry gets a zero factor. A matrix whose fit
    moved less than TOLERANCE of its size is done, and stays as it was at that step."""
    weights = mask.astype(np.float64)
    b = _start(values, mask, rank, seed)
    fit = np.zeros(values.shape)
    active = np.arange(values.shape[0])
    for _ in range(ITERATIONS):
        v, w = values[active], weights[active]
        a = solve_rows(v, w, b[active], ridge[active])
        moved = solve_rows(np.swapaxes(v, 1, 2), np.swapaxes(w, 1, 2), a, ridge[active])
        new = a @ np.swapaxes(moved, 1, 2)
        change = np.sqrt(np.square(new - fit[active]).sum(axis=(1, 2)))
        size = np.maximum(np.sqrt(np.square(new).sum(axis=(1, 2))), 1e-300)
        fit[active], b[active] = new, moved
        active = active[change > TOLERANCE * size]
        if not active.size:
            break
    return fit
