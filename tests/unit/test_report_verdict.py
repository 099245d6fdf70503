"""The verdict's sentence follows the amounts: "pay them alike" only where the recommended payout does."""

from __future__ import annotations

import pytest

from fedsv.app.report_verdict import paid_shares, verdict_line
from fedsv.valuation.accounting.verdict import Verdict

MEMBERS = [f"p00{k}" for k in range(6)]
NO_DIFFERENCE = Verdict(9.0, 0.11, 6, [MEMBERS])


def test_a_verdict_of_no_difference_with_unequal_amounts_says_what_they_are_paid() -> None:
    """The issue's case: no difference found (p = 0.11), yet one member paid 0 and the others 17-23%."""
    shares = paid_shares(dict(zip(MEMBERS, [-0.01, 0.17, 0.18, 0.19, 0.20, 0.23], strict=True)))
    assert shares["p000"] == 0.0 and sum(shares.values()) == pytest.approx(1.0)
    line = verdict_line(NO_DIFFERENCE, shares, "fedsv_shrunk")
    assert "do NOT tell the 6 members apart (p = 0.11)" in line
    assert "pay them alike" not in line
    assert "fedsv_shrunk pays them 0.0–23.7%" in line and "--rule groups" in line


def test_a_verdict_of_no_difference_with_alike_amounts_says_pay_them_alike() -> None:
    shares = paid_shares(dict(zip(MEMBERS, [0.16, 0.17, 0.17, 0.16, 0.17, 0.17], strict=True)))
    assert verdict_line(NO_DIFFERENCE, shares, "fedsv_shrunk").endswith("; pay them alike")


def test_a_verdict_that_tells_members_apart_is_unchanged() -> None:
    apart = Verdict(40.0, 0.0001, 6, [MEMBERS[:3], MEMBERS[3:]])
    shares = paid_shares(dict(zip(MEMBERS, [0.3, 0.3, 0.3, 0.0, 0.0, 0.1], strict=True)))
    assert verdict_line(apart, shares, "fedsv_shrunk") == apart.line()
    assert paid_shares({"p000": -1.0, "p001": None}) == {}
