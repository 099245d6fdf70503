"""How a run's stated errors and payout shares compare with reruns of it: the calibration's measures
(benchmarks/bench_calibration.py runs them on five federations; docs/valuation.md has the table)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsv.valuation.accounting.verdict import Z95

LAMBDAS = np.linspace(0.0, 1.0, 21)
"""The pulls best_pull tries (1: the completed totals themselves)."""


def shares(totals: np.ndarray) -> np.ndarray:
    """Each run's payout shares (runs, members): negative values paid nothing."""
    paid = np.maximum(totals, 0.0)
    return paid / np.maximum(paid.sum(axis=1, keepdims=True), 1e-300)


@dataclass(frozen=True)
class Members:
    """sd/stated member by member, on the reruns as run: its 10th and 90th percentiles over the members
    with a known error, and the lowest share of reruns whose 95% interval holds a member's mean total
    (the member it is lowest for)."""

    low: float
    high: float
    coverage: float
    worst: str

    @classmethod
    def of(cls, ids: list[str], totals: np.ndarray, errors: np.ndarray) -> Members:
        """From (reruns, members) totals and errors; a rerun whose error for a member is unknown (NaN,
        or infinite: never selected) is left out of that member's figures, not counted as a miss."""
        finite = np.isfinite(errors)
        runs = finite.sum(axis=0)
        stated = np.where(finite, errors, 0.0).sum(axis=0) / np.maximum(runs, 1)
        known = (runs > 0) & (stated > 0)
        ratio = totals.std(axis=0, ddof=1)[known] / stated[known]
        held = finite & (np.abs(totals - totals.mean(axis=0)) <= Z95 * np.where(finite, errors, 0.0))
        coverage = held[:, known].sum(axis=0) / runs[known]
        low, high = np.quantile(ratio, [0.1, 0.9])
        worst = int(np.argmin(coverage))
        named = [pid for pid, k in zip(ids, known, strict=True) if k]
        return cls(float(low), float(high), float(coverage[worst]), named[worst])


def sd_stated(totals: np.ndarray, errors: np.ndarray, resampled: bool) -> float:
    """sd/stated, median member; a resample's SD is raised by sqrt(n / (n - 1)), what drawing the n
    reruns with replacement takes off it on average."""
    n = totals.shape[0]
    sd = totals.std(axis=0, ddof=1) * (math.sqrt(n / (n - 1)) if resampled else 1.0)
    stated = np.nanmean(errors, axis=0)
    spread = np.isfinite(stated) & (stated > 0)
    return float(np.median(sd[spread] / stated[spread]))


def share_rmse(totals: np.ndarray, expected: np.ndarray) -> float:
    """The RMSE of each run's payout shares against the expected shares."""
    return float(np.sqrt(np.mean(np.square(shares(totals) - expected))))


def share_gap(totals: np.ndarray, pairs: list[tuple[int, int]]) -> float:
    """Twins' mean |difference| in payout shares over the mean share: two twins worth less than nothing
    are both paid 0, however far apart their values."""
    paid = shares(totals)
    gaps = np.abs(paid[:, [a for a, _ in pairs]] - paid[:, [b for _, b in pairs]])
    return float(gaps.mean() / paid.mean())


def best_pull(completed: np.ndarray, centre: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Of the pulls centre + lambda (completed - centre), lambda in LAMBDAS, the one whose payout shares
    are nearest the expected shares: its lambda and its share RMSE over the completed totals'."""
    base = share_rmse(completed, expected)
    ratios = [share_rmse(centre + lam * (completed - centre), expected) / base for lam in LAMBDAS]
    k = int(np.argmin(ratios))
    return float(LAMBDAS[k]), float(ratios[k])
