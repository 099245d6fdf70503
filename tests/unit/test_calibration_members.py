"""The calibration benchmark's member-by-member figures: a median of right-sized errors does not hide a
member whose errors are half their size."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation.errors.rerun_check import Members, best_pull, share_gap


def test_a_member_with_half_sized_errors_is_named_with_its_coverage() -> None:
    rng = np.random.default_rng(0)
    runs, ids = 4000, [f"p{i:03d}" for i in range(6)]
    totals = rng.normal(0.1, 0.02, (runs, len(ids)))
    errors = np.full((runs, len(ids)), 0.02)
    errors[:, 4] = 0.01  # stated at half its spread
    found = Members.of(ids, totals, errors)
    assert found.worst == "p004"
    assert found.coverage == pytest.approx(0.68, abs=0.03)  # P(|z| <= 1.96 / 2)
    assert found.low == pytest.approx(1.0, abs=0.05) and found.high > 1.4


def test_members_without_a_known_error_are_left_out() -> None:
    rng = np.random.default_rng(1)
    ids = ["p000", "p001", "p002"]
    totals = rng.normal(0.0, 1.0, (2000, 3))
    errors = np.ones((2000, 3))
    errors[:, 0] = np.inf  # never selected: unknown, not certain
    errors[:, 2] = 0.0  # turned away in every round: exactly 0, nothing to cover
    totals[:, 2] = 0.0
    found = Members.of(ids, totals, errors)
    assert found.worst == "p001" and found.coverage == pytest.approx(0.95, abs=0.015)
    assert found.low == pytest.approx(1.0, abs=0.05) and found.high == pytest.approx(1.0, abs=0.05)


def test_a_rerun_with_an_unknown_error_is_not_a_miss() -> None:
    """A member's error unknown in some reruns (NaN; infinite where it was never selected): those
    reruns are left out of its figures, and its known errors, right-sized, still cover 95%."""
    rng = np.random.default_rng(2)
    ids = ["p000", "p001", "p002"]
    totals = rng.normal(0.0, 1.0, (3000, 3))
    errors = np.ones((3000, 3))
    errors[::3, 0] = np.nan
    errors[1::3, 1] = np.inf
    errors[:, 2], totals[:, 2] = 0.0, 0.0
    found = Members.of(ids, totals, errors)
    assert found.coverage == pytest.approx(0.95, abs=0.02)
    assert found.low == pytest.approx(1.0, abs=0.06) and found.high == pytest.approx(1.0, abs=0.06)


def test_twins_worth_less_than_nothing_are_paid_alike_however_far_apart_their_values() -> None:
    """The twins' gap in shares: two twins both below 0 are both paid 0 (gap 0, where their values are
    far apart); twins paid 30% and 10% of a pot of four members are 0.2 / 0.25 = 0.8 of a mean share
    apart."""
    below = np.array([[0.3, -0.5, 0.3, -0.1]])  # members 0 and 2 twins, 1 and 3 twins
    assert share_gap(below, [(1, 3)]) == 0.0
    assert share_gap(below, [(0, 2), (1, 3)]) == 0.0
    paid = np.array([[0.3, 0.3, 0.1, 0.3]])
    assert share_gap(paid, [(0, 2)]) == pytest.approx(0.8)


def test_the_share_targets_reference_pulls_equals_together_and_leaves_distinct_members_alone() -> None:
    rng = np.random.default_rng(2)
    equals = 0.1 + rng.normal(0.0, 0.02, (64, 8))  # equal in truth: the mean is their expected share
    centre = np.broadcast_to(equals.mean(axis=1, keepdims=True), equals.shape)
    lam, ratio = best_pull(equals, centre, np.full(8, 1 / 8))
    assert lam == 0.0 and ratio < 1e-9
    distinct = np.linspace(0.05, 0.4, 8) + rng.normal(0.0, 0.001, (64, 8))  # apart by far more than noise
    centre = np.broadcast_to(distinct.mean(axis=1, keepdims=True), distinct.shape)
    expected = (distinct / distinct.sum(axis=1, keepdims=True)).mean(axis=0)
    lam, ratio = best_pull(distinct, centre, expected)
    assert lam == 1.0 and ratio == pytest.approx(1.0)
