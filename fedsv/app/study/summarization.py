"""Data summarization: which of each round's selected participants a replay keeps, for a dismissed fraction q.

After the original run, training is repeated with the same per-round selection while a fraction q of
each round's selected participants is dismissed: the floor(q * m) lowest by the original run's TOTAL
FedSV (or LOO), or a seeded random draw. The replays pin the selection with RunConfig.selection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

Q_VALUES = tuple(round(0.1 * i, 1) for i in range(10))  # 0.0, 0.1, ..., 0.9
SUMMARY_METHODS = ("fedsv", "loo", "random")
Schedule = dict[int, tuple[int, ...]]


def dismiss_count(q: float, m: int) -> int:
    """floor(q * m) participants dismissed of m (at least one is always kept)."""
    if not 0.0 <= q < 1.0:
        raise ValueError(f"dismissed fraction q must lie in [0, 1), got {q}")
    if m < 1:
        raise ValueError(f"a round selects at least one participant, got m={m}")
    return min(m - 1, math.floor(q * m + 1e-9))


def keep_by_value(selected: Sequence[int], totals: npt.NDArray[np.float64], dismiss: int) -> tuple[int, ...]:
    """`selected` without its `dismiss` lowest-valued ranks (ties: the lower rank is dismissed first)."""
    if not 0 <= dismiss < len(selected):
        raise ValueError(f"cannot dismiss {dismiss} of {len(selected)} selected participants")
    order = sorted(selected, key=lambda rank: (float(totals[rank]), rank))
    return tuple(sorted(order[dismiss:]))


def keep_at_random(selected: Sequence[int], dismiss: int, rng: np.random.Generator) -> tuple[int, ...]:
    """`selected` without `dismiss` ranks drawn uniformly at random."""
    if not 0 <= dismiss < len(selected):
        raise ValueError(f"cannot dismiss {dismiss} of {len(selected)} selected participants")
    ranks = sorted(selected)
    gone = set(rng.choice(len(ranks), size=dismiss, replace=False).tolist()) if dismiss else set()
    return tuple(r for i, r in enumerate(ranks) if i not in gone)


def replay_schedule(
    selection: Mapping[int, Sequence[int]],
    method: str,
    q: float,
    totals: Mapping[str, npt.NDArray[np.float64]],
    seed: int,
    draw: int = 0,
) -> Schedule:
    """round -> kept ranks for a replay dismissing fraction q of each round's selection by `method`."""
    if method not in SUMMARY_METHODS:
        raise ValueError(f"unknown summarization method {method!r}; choose one of {list(SUMMARY_METHODS)}")
    out: Schedule = {}
    for number in sorted(selection):
        selected = list(selection[number])
        k = dismiss_count(q, len(selected))
        if method == "random":  # seeded by the count, so q values dismissing as many share a replay
            out[number] = keep_at_random(selected, k, np.random.default_rng([seed, draw, number, k]))
        else:
            out[number] = keep_by_value(selected, totals[method], k)
    return out


def selection_spec(schedule: Schedule) -> str:
    """RunConfig.selection text of a schedule: "1=0,3,5;2=1,2,7"."""
    return ";".join(f"{n}={','.join(str(r) for r in schedule[n])}" for n in sorted(schedule))


def is_original(schedule: Schedule, selection: Mapping[int, Sequence[int]]) -> bool:
    """Does the schedule keep every selected participant (the original run, no replay needed)?"""
    return all(tuple(sorted(selection[n])) == schedule[n] for n in selection) and set(schedule) == set(
        selection
    )
