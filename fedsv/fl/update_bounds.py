"""Bounds on the L2 norm of participants' updates: clip or reject one that is far larger than the round's."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fedsv.fl.updates import ClientUpdate

POLICIES = ("clip-or-reject", "clip", "reject", "none")


@dataclass(frozen=True)
class NormBound:
    """How updates are bounded.

    policy: "clip-or-reject" (the runtime's default) scales an update over the bound down to it when
        it is within `reject_multiple` times the bound and the guard finds it a data-rich member's
        (`keep_clipped`, `update_direction.clippable`: its member declares more samples than the
        federation's median and it points along the validation loss's descent), and drops any other.
        An honest member with several times the others' data takes more local steps and sends a larger
        update (2-5x the typical norm on the digits-owners federation), which "reject" turns away in
        some runs and not others; a boosted update (10^6x), one against the descent (colluders sending
        -3x their update, which a norm alone cannot tell from a rich member's) and a large one from a
        member of ordinary size (label noise makes larger steps) are still dropped. "reject" drops every
        update over the bound from aggregation and valuation; "clip" scales every one down to it (a
        linear change, so the round's game keeps its fast path; it still weighs `multiple` times an
        ordinary update); "none" accepts any finite update.
    bound: an absolute bound on the L2 norm of an update (over all its tensors); 0 means adaptive:
        `multiple` times the typical norm (typical_norm: the median of the round's norms and those
        accepted in recent rounds), which a minority of participants cannot move.
    reject_multiple: "clip-or-reject" drops an update over this times the bound.
    """

    policy: str = "clip"
    bound: float = 0.0
    multiple: float = 2.0
    reject_multiple: float = 4.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"update_norm_policy must be one of {list(POLICIES)}, got {self.policy!r}")
        if not (math.isfinite(self.bound) and self.bound >= 0):
            raise ValueError(f"update_norm_bound must be 0 (adaptive) or a positive number, got {self.bound}")
        if not (math.isfinite(self.multiple) and self.multiple >= 1):
            raise ValueError(f"update_norm_multiple must be a number >= 1, got {self.multiple}")
        if not (math.isfinite(self.reject_multiple) and self.reject_multiple >= 1):
            raise ValueError(f"update_norm_reject_multiple must be a number >= 1, got {self.reject_multiple}")


@dataclass(frozen=True)
class BoundedUpdates:
    """A round's updates after the bound: those aggregated and valued, and what was done to others."""

    updates: list[ClientUpdate]
    bound: float
    norms: dict[str, float]
    clipped: list[str]
    rejected: list[str]


def update_norm(delta: Mapping[str, Tensor]) -> float:
    """L2 norm of an update over all its floating-point tensors, accumulated in float64."""
    norms = [
        float(torch.linalg.vector_norm(t, dtype=torch.float64))
        for t in delta.values()
        if t.is_floating_point()
    ]
    return math.hypot(*norms)


def typical_norm(norms: Sequence[float], smaller_of_few: bool = True) -> float:
    """The norm an honest update of the round is taken to have: the median of the norms; with fewer
    than three there is no majority to take a median of, and (`smaller_of_few`) the smaller sets it."""
    ordered = sorted(norms)
    if not ordered:
        return 0.0
    if len(ordered) < 3 and smaller_of_few:
        return ordered[0]
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def round_bound(norms: Sequence[float], rule: NormBound, smaller_of_few: bool = True) -> float:
    """The bound for a round whose updates have these norms (inf when the policy is "none")."""
    if rule.policy == "none":
        return math.inf
    if rule.bound > 0:
        return rule.bound
    typical = typical_norm(norms, smaller_of_few)
    return rule.multiple * typical if typical > 0 else math.inf


def _rejection_line(bound: float, rule: NormBound) -> float:
    """The norm over which `rule` rejects an update rather than clipping it (inf: it never does)."""
    if rule.policy == "reject":
        return bound
    if rule.policy == "clip-or-reject":
        return rule.reject_multiple * bound
    return math.inf


def bound_updates(
    updates: Sequence[ClientUpdate],
    rule: NormBound,
    history: Sequence[float] = (),
    smaller_of_few: bool = True,
) -> BoundedUpdates:
    """Apply `rule` to a round's updates; the result keeps the updates' order.

    An adaptive bound takes its median over the round's norms and `history` (norms accepted in
    earlier rounds), so that in a round of one or two updates no single update sets its own bound
    (`smaller_of_few`: with fewer than three norms in all, the smaller; else their mean, as before
    the guard existed).
    Rejecting never empties a round: when every update is over the rejection line (the bound; for
    "clip-or-reject", `reject_multiple` times it) they are clipped to the bound instead, so that no
    participant (a lone one, say) can stop a run by being rejected. An update whose norm overflows
    (inf) is rejected under any policy but "none" when another is finite: clipped, it would be a zero
    delta with a FedAvg weight.
    """
    norms = {u.participant: update_norm(u.delta) for u in updates}
    bound = round_bound([*norms.values(), *history], rule, smaller_of_few)
    reject_over = _rejection_line(bound, rule)
    if updates and all(n > reject_over for n in norms.values()):
        reject_over = math.inf
    kept: list[ClientUpdate] = []
    clipped: list[str] = []
    rejected: list[str] = []
    some_finite = any(math.isfinite(n) for n in norms.values())
    for u in updates:
        norm = norms[u.participant]
        if norm <= bound:
            kept.append(u)
        elif norm > reject_over or (math.isinf(norm) and some_finite):
            rejected.append(u.participant)
        else:
            scale = bound / norm
            delta = {k: t * scale if t.is_floating_point() else t for k, t in u.delta.items()}
            kept.append(replace(u, delta=delta))
            clipped.append(u.participant)
    return BoundedUpdates(kept, bound, norms, clipped, rejected)


def keep_clipped(bounded: BoundedUpdates, eligible: Collection[str]) -> BoundedUpdates:
    """clip-or-reject's second test: a clipped update stays only when its member is `eligible` (the
    guard's test, `update_direction.clippable`); the others are rejected, unless that would leave the round
    empty."""
    against = [p for p in bounded.clipped if p not in eligible]
    if not against or len(against) == len(bounded.updates):
        return bounded
    dropped = set(against)
    return BoundedUpdates(
        [u for u in bounded.updates if u.participant not in dropped],
        bounded.bound,
        bounded.norms,
        [p for p in bounded.clipped if p not in dropped],
        [p for p in bounded.norms if p in dropped or p in bounded.rejected],
    )
