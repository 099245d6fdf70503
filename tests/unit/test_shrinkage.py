"""The shrunk value: totals pulled towards their mean by how much of their spread is noise."""

from __future__ import annotations

import math

import numpy as np

from fedsv.valuation.shrinkage import Shrinkage


def test_equal_members_all_move_to_the_mean() -> None:
    rng = np.random.default_rng(0)
    totals, errors = rng.normal(0.05, 0.01, 20), np.full(20, 0.01)
    shrinkage = Shrinkage.of(totals, errors)
    # the spread is about the noise: little or nothing is left to tell them apart
    assert np.ptp(shrinkage.apply(totals)) < 0.5 * np.ptp(totals)
    assert math.isclose(shrinkage.apply(totals).mean(), totals.mean(), rel_tol=1e-9)  # equal errors: sum kept


def test_a_member_far_beyond_its_noise_keeps_its_distance_and_the_order_holds() -> None:
    totals = np.array([0.10, 0.11, 0.09, 0.10, -0.30])
    shrunk = Shrinkage.of(totals, np.full(5, 0.01)).apply(totals)
    assert shrunk[4] < -0.25 and np.array_equal(np.argsort(shrunk), np.argsort(totals))


def test_the_shrinkage_is_closer_to_the_truth_on_average() -> None:
    """James and Stein: with noise of known size, the shrunk totals' squared error is smaller."""
    rng = np.random.default_rng(1)
    raw, shrunk = [], []
    for _ in range(200):
        truth = rng.normal(0.0, 0.02, 30)
        totals = truth + rng.normal(0.0, 0.02, 30)
        raw.append(np.mean(np.square(totals - truth)))
        shrunk.append(np.mean(np.square(Shrinkage.of(totals, np.full(30, 0.02)).apply(totals) - truth)))
    assert np.mean(shrunk) < 0.7 * np.mean(raw)


def test_unknown_errors_are_left_alone_and_the_map_is_linear() -> None:
    totals = np.array([0.1, 0.2, 0.3, 0.0, 0.5])
    errors = np.array([0.05, 0.05, 0.05, math.inf, 0.05])
    shrinkage = Shrinkage.of(totals, errors)
    shrunk = shrinkage.apply(totals)
    assert shrunk[3] == 0.0 and np.allclose(
        shrinkage.matrix() @ np.where(errors < 1, totals, 0), np.where(errors < 1, shrunk, 0)
    )
    few = Shrinkage.of(totals[:2], errors[:2])
    assert np.array_equal(few.apply(totals[:2]), totals[:2])  # too few members: nothing to shrink by


def test_a_value_known_exactly_is_not_pulled_and_the_less_noisy_keep_more() -> None:
    """A member turned away in every round (0 ± 0) earns nothing from the others' mean; a member whose
    value is surer than the average keeps more of its distance than the common factor."""
    totals = np.array([0.0, 0.05, 0.04, 0.06, 0.05, 0.045])
    errors = np.array([0.0, 0.02, 0.02, 0.02, 0.002, 0.02])
    shrinkage = Shrinkage.of(totals, errors)
    shrunk = shrinkage.apply(totals)
    assert shrunk[0] == 0.0 and shrinkage.factors[0] == 1.0
    assert shrinkage.factors[4] > shrinkage.factors[1] == shrinkage.factors[2]
