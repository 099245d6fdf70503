"""The calibration benchmark's member-by-member figures: a median of right-sized errors does not hide a
member whose errors are half their size."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_calibration import Members


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
