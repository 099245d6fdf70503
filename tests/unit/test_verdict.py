"""The verdict: a test of the members' differences against their errors, and the groups it forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsv.valuation.accounting.verdict import column_groups, differ, verdict


def test_equal_members_with_noisy_values_are_not_told_apart() -> None:
    rng = np.random.default_rng(0)
    values = {f"p{i:03d}": float(rng.normal(0.05, 0.01)) for i in range(20)}
    result = verdict(values, dict.fromkeys(values, 0.01))
    assert not result.distinguishes and result.p_value > 0.05
    assert result.groups == [sorted(values, key=lambda p: -values[p])]
    assert "do NOT tell" in result.line()


def test_distinct_members_are_told_apart_and_grouped() -> None:
    values = {"a": 1.0, "b": 0.99, "c": 0.5, "d": 0.49, "e": 0.0}
    result = verdict(values, dict.fromkeys(values, 0.01))
    assert result.distinguishes and result.p_value < 1e-6
    assert result.groups == [["a", "b"], ["c", "d"], ["e"]]


def test_unknown_errors_are_left_out_and_stand_alone() -> None:
    values = {"a": 1.0, "b": 0.0, "c": 0.5}
    result = verdict(values, {"a": 0.01, "b": 0.01, "c": None})
    assert result.members == 2 and result.distinguishes
    assert ["c"] in result.groups
    lone = verdict({"a": 1.0}, {"a": 0.1})
    assert math.isnan(lone.p_value) and "too few" in lone.line()


def test_the_test_holds_its_level_on_equal_members() -> None:
    """Under no difference, p < 0.05 in about 5% of draws (Cochran's Q is chi-square)."""
    rng = np.random.default_rng(1)
    rejections = 0
    for _ in range(400):
        errors = rng.uniform(0.5, 2.0, size=10)
        values = {f"p{i}": float(rng.normal(0, e)) for i, e in enumerate(errors)}
        rejections += verdict(values, {f"p{i}": float(e) for i, e in enumerate(errors)}).distinguishes
    assert 0.02 <= rejections / 400 <= 0.09


def test_groups_of_many_draws_at_once_are_the_verdicts_own() -> None:
    """column_groups (every draw tested at once, what the averaged pull calls) gives verdict()'s groups
    as column indices, on draws that split, that do not, with tied values (ordered by name), with
    unknown errors and with an exact value."""
    rng = np.random.default_rng(3)
    ids = [f"p{i:03d}" for i in (4, 1, 7, 0, 3, 6, 2, 5)]  # columns not in name order
    errors = rng.uniform(0.5, 2.0, len(ids))
    draws = np.concatenate(
        [
            rng.normal(0.0, 1.0, (40, len(ids))),  # mostly one group
            rng.normal(np.arange(len(ids)) * 2.0, 1.0, (40, len(ids))),  # several
            np.round(rng.normal(0.0, 3.0, (40, len(ids)))),  # ties
            np.outer(np.linspace(0.0, 10.0, 200), np.eye(len(ids))[0]),  # one member apart: p near the level
        ]
    )

    def expected(row: np.ndarray, errs: np.ndarray) -> list[list[int]] | None:
        found = verdict(
            dict(zip(ids, map(float, row), strict=True)), dict(zip(ids, map(float, errs), strict=True))
        )
        if math.isnan(found.p_value):
            return None
        return [[ids.index(pid) for pid in group] for group in found.groups]

    got = column_groups(ids, draws, errors)
    assert got == [expected(row, errors) for row in draws]
    assert {len(g) for g in got if g is not None} != {1}  # some draws were split
    p_values = [
        verdict(
            dict(zip(ids, map(float, r), strict=True)), dict(zip(ids, map(float, errors), strict=True))
        ).p_value
        for r in draws
    ]
    assert sum(0.025 <= p < 0.05 and len(g) > 1 for p, g in zip(p_values, got, strict=True) if g) >= 3
    for unknown_at in ([2], [0, 5]):  # members left out of the test: groups of their own
        unknown = errors.copy()
        unknown[unknown_at] = [math.nan, math.inf][: len(unknown_at)]
        assert column_groups(ids, draws, unknown) == [expected(row, unknown) for row in draws]
    exact = errors.copy()
    exact[3] = 0.0  # an exact value: verdict()'s own rule
    assert column_groups(ids, draws[:20], exact) == [expected(row, exact) for row in draws[:20]]
    assert column_groups(ids[:1], draws[:3, :1], errors[:1]) == [None] * 3


def test_an_exact_value_is_the_level_the_others_are_tested_against() -> None:
    """Error 0: equal values are not a difference, however many members are exact; the others are
    tested against the exact value (one degree of freedom each); two exact values that differ are."""
    same = verdict({"a": 0.3, "b": 0.3, "c": 0.3}, {"a": 0.0, "b": 0.01, "c": 0.02})
    assert not same.distinguishes and same.p_value == 1.0 and "do NOT tell" in same.line()
    near = verdict({"a": 0.3, "b": 0.31}, {"a": 0.0, "b": 0.01})  # one error away: chi-square(1) = 1
    assert near.p_value == pytest.approx(0.3173, abs=1e-4) and not near.distinguishes
    far = verdict({"a": 0.3, "b": 0.5}, {"a": 0.0, "b": 0.01})
    assert far.distinguishes and far.groups == [["b"], ["a"]]
    assert verdict({"a": 0.3, "b": 0.3}, {"a": 0.0, "b": 0.0}).p_value == 1.0
    assert verdict({"a": 0.3, "b": 0.4}, {"a": 0.0, "b": 0.0}).p_value == 0.0


def test_two_values_differ_beyond_1_96_combined_standard_errors() -> None:
    """The 95% line: errors 0.3 and 0.4 combine to 0.5, so values 0.97 apart do not differ and 0.99
    apart do (Z95 = 1.96 pinned between 1.94 and 1.98)."""
    assert differ(0.0, 0.3, 0.97, 0.4) is False
    assert differ(0.0, 0.3, 0.99, 0.4) is True
    assert differ(0.0, math.inf, 5.0, 0.1) is None
    grouped = verdict({"a": 2.0, "b": 1.03, "c": 1.01, "d": 0.0}, {"a": 0.3, "b": 0.4, "c": 0.4, "d": 0.3})
    assert grouped.distinguishes and grouped.groups == [["a", "b"], ["c"], ["d"]]
