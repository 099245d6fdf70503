"""Whether values tell members apart: a test of their differences against their errors, and the groups
of members that cannot be told apart."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import chi2

Groups = list[list[int]] | None
"""Groups as column indices (None: the verdict could not test)."""

Z95 = 1.959964
"""Two values differ at 95% when they are more than Z95 combined standard errors apart."""

LEVEL = 0.05
"""The test's level: the values tell members apart when the p-value is below it."""


@dataclass(frozen=True)
class Verdict:
    """The test of whether the members' values differ more than their errors allow (Cochran's Q: the
    weighted spread of the values around their weighted mean, chi-square with n - 1 degrees of freedom
    when every member's value is the same), and the groups: one of every member where the test finds no
    difference; else members in value order, each group led by its best member and holding the next
    ones whose values do not differ from the leader's at 95%.
    `members`: how many were tested (those with a finite, known error); `p_value` NaN where fewer than
    two could be."""

    statistic: float
    p_value: float
    members: int
    groups: list[list[str]]

    @property
    def distinguishes(self) -> bool:
        return self.p_value < LEVEL

    def line(self) -> str:
        """The verdict in one line."""
        if math.isnan(self.p_value):
            return "verdict: too few values with a known error to tell members apart"
        many = sum(1 for g in self.groups if len(g) > 1)
        if not self.distinguishes:
            return (
                f"verdict: the values do NOT tell the {self.members} members apart (p = {self.p_value:.2f}): "
                "their differences are within their errors; pay them alike"
            )
        return (
            f"verdict: the values tell members apart (p = {self.p_value:.2g}); {len(self.groups)} groups, "
            f"{many} of them of members that cannot be told apart from each other"
        )


def differ(a: float, a_error: float, b: float, b_error: float) -> bool | None:
    """Whether two values differ at 95%; None when either's error is unknown."""
    if not (math.isfinite(a_error) and math.isfinite(b_error)):
        return None
    return abs(a - b) > Z95 * math.hypot(a_error, b_error)


def verdict(values: Mapping[str, float], errors: Mapping[str, float | None]) -> Verdict:
    """The verdict on `values` (participant -> value) with their standard errors (None or NaN: unknown).
    A member whose error is unknown is left out of the test and forms a group of its own. A member
    whose error is 0 is exact: two exact values that differ are a difference; else the others are
    tested against the exact value (chi-square with one degree of freedom per member with an error).
    """
    known: dict[str, tuple[float, float]] = {}
    for pid, value in values.items():
        error = errors.get(pid)
        if error is not None and math.isfinite(float(error)) and math.isfinite(value):
            known[pid] = (value, float(error))
    statistic, p_value = math.nan, math.nan
    exact = [p for p, (_, e) in known.items() if e == 0]
    if len(known) >= 2:
        if exact:  # an error of 0: the exact values are the level the others are tested against
            levels = {known[p][0] for p in exact}
            noisy = [(v, e) for p, (v, e) in known.items() if e > 0]
            if len(levels) > 1:  # two exact values that differ: a real difference
                statistic, p_value = math.inf, 0.0
            else:
                level = levels.pop()
                statistic = sum(((v - level) / e) ** 2 for v, e in noisy)
                p_value = float(chi2.sf(statistic, len(noisy))) if noisy else 1.0
        else:
            weights = {p: 1.0 / e**2 for p, (_, e) in known.items()}
            mean = sum(weights[p] * v for p, (v, _) in known.items()) / sum(weights.values())
            statistic = sum(weights[p] * (v - mean) ** 2 for p, (v, _) in known.items())
            p_value = float(chi2.sf(statistic, len(known) - 1))
    groups: list[list[str]] = []
    leader: tuple[float, float] | None = None
    order = sorted(values, key=lambda p: (-values[p], p))
    if not p_value < LEVEL:  # the test finds no difference: every member with a known error is alike
        alike = [p for p in order if p in known]
        return Verdict(
            statistic, p_value, len(known), [alike] * bool(alike) + [[p] for p in order if p not in known]
        )
    for pid in order:
        if pid not in known:
            groups.append([pid])
            leader = None
            continue
        value, error = known[pid]
        if leader is not None and differ(leader[0], leader[1], value, error) is False:
            groups[-1].append(pid)
            continue
        groups.append([pid])
        leader = (value, error)
    return Verdict(statistic, p_value, len(known), groups)


def owners_verdict(
    values: Mapping[str, float], errors: Mapping[str, float | None], owners: Sequence[Sequence[str]]
) -> Verdict:
    """The verdict on owners: the members listed together in `owners` (one owner's identities, each
    holding an equal part of its value: owners.py) are tested as one member, with their values and
    errors summed (the parts move together); each group lists an owner's members together."""
    members = {pid: [pid] for pid in values}
    for owner in owners:
        held = [pid for pid in owner if pid in values]
        for pid in held:
            members.pop(pid, None)
        if held:
            members[held[0]] = held
    pooled = {key: sum(float(values[pid]) for pid in held) for key, held in members.items()}
    pooled_errors: dict[str, float | None] = {}
    for key, held in members.items():
        parts = [errors.get(pid) for pid in held]
        known = [float(e) for e in parts if e is not None]
        pooled_errors[key] = sum(known) if len(known) == len(parts) else None
    found = verdict(pooled, pooled_errors)
    groups = [[pid for key in group for pid in members[key]] for group in found.groups]
    return Verdict(found.statistic, found.p_value, found.members, groups)


@dataclass(frozen=True)
class Labels:
    """verdict()'s groups of many rows of values at once: per row, the members in value order (D, N)
    and each one's group there (D, N; groups numbered in value order, as verdict() lists them)."""

    order: npt.NDArray[np.int64]
    groups: npt.NDArray[np.int64]

    def by_column(self) -> npt.NDArray[np.int64]:
        """Each member's group per row, by column (D, N)."""
        out = np.empty_like(self.groups)
        np.put_along_axis(out, self.order, self.groups, axis=1)
        return out

    def lists(self) -> list[Groups]:
        """Each row's groups as lists of column indices, in value order."""
        out: list[Groups] = []
        for order, groups in zip(self.order.tolist(), self.groups.tolist(), strict=True):
            found: list[list[int]] = [[] for _ in range(max(groups) + 1)]
            for member, group in zip(order, groups, strict=True):
                found[group].append(member)
            out.append(found)
        return out


def column_labels(
    ids: Sequence[str], draws: npt.NDArray[np.float64], errors: npt.NDArray[np.float64]
) -> Labels | None:
    """verdict()'s groups of each row of `draws` (D, N: values of the members `ids`) with `errors` (N,;
    NaN or inf: unknown), every row tested and walked at once (what the pull's draws call thousands of
    times per uncertainty); None where verdict()'s own rules are needed: an exact value (error 0), a
    value that is not finite, or fewer than two members with a known error."""
    known = np.isfinite(errors)
    if np.any(errors[known] == 0) or not np.all(np.isfinite(draws)) or known.sum() < 2:
        return None
    weights = 1.0 / np.square(errors[known])
    tested = draws[:, known]
    mean = tested @ weights / weights.sum()
    split = chi2.sf(np.square(tested - mean[:, None]) @ weights, int(known.sum()) - 1) < LEVEL
    by_name = np.argsort(np.argsort(np.asarray(ids, dtype=object)))
    order = np.lexsort((np.broadcast_to(by_name, draws.shape), -draws), axis=-1)
    values, spread, alike = np.take_along_axis(draws, order, axis=1), errors[order], known[order]
    # no difference found: the known members are one group, each unknown one a group of its own after it
    groups = np.where(alike, 0, np.cumsum(~alike, axis=1))
    # a difference found: walking down the values, a member joins its group's first (the leader) unless
    # they differ at 95%; a member left out of the test is a group of its own, and the chain starts again
    current, leader, lead, has = (
        np.full(len(draws), -1),
        np.zeros(len(draws)),
        np.zeros(len(draws)),
        np.zeros(len(draws), dtype=np.bool_),
    )
    walked = np.empty_like(groups)
    for k in range(draws.shape[1]):
        value, error, inside = values[:, k], spread[:, k], alike[:, k]
        joins = has & inside & ~(np.abs(leader - value) > Z95 * np.hypot(lead, error))
        current = current + ~joins
        walked[:, k] = current
        leader, lead = np.where(joins, leader, value), np.where(joins, lead, error)
        has = inside
    return Labels(order, np.where(split[:, None], walked, groups))


def column_groups(
    ids: Sequence[str], draws: npt.NDArray[np.float64], errors: npt.NDArray[np.float64]
) -> list[Groups]:
    """verdict()'s groups of each row of `draws` (D, N) with `errors` (N,) as column indices (None for a
    row the verdict cannot test): column_labels' where it applies, verdict()'s own elsewhere."""
    labels = column_labels(ids, draws, errors)
    if labels is not None:
        return labels.lists()
    named = dict(zip(ids, map(float, errors), strict=True))
    return [_columns(ids, verdict(dict(zip(ids, map(float, row), strict=True)), named)) for row in draws]


def _columns(ids: Sequence[str], found: Verdict) -> Groups:
    """A verdict's groups as column indices of `ids` (None where it could not test)."""
    if math.isnan(found.p_value):
        return None
    column = {pid: k for k, pid in enumerate(ids)}
    return [[column[pid] for pid in group] for group in found.groups]
