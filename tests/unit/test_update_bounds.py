"""Norm bounds on updates: clip or reject one far larger than the round's, so one participant cannot steer."""

from __future__ import annotations

import math

import pytest
import torch

from fedsv.data.corruptions import parse_corruption
from fedsv.fl.update_bounds import NormBound, bound_updates, keep_clipped, round_bound, update_norm
from fedsv.fl.updates import ClientUpdate


def _update(pid: str, norm: float) -> ClientUpdate:
    """An update of exactly this L2 norm (two tensors and an integer buffer, which is never scaled)."""
    a = torch.full((3, 4), 1.0)
    b = torch.full((5,), 1.0)
    raw = math.sqrt(12 + 5)
    return ClientUpdate(pid, {"w": a * norm / raw, "b": b * norm / raw, "steps": torch.tensor(7)}, 10)


def test_adaptive_bound_is_a_multiple_of_the_median_and_clips_to_it() -> None:
    updates = [_update("p0", 1.0), _update("p1", 2.0), _update("p2", 3.0), _update("p3", 1e6)]
    bounded = bound_updates(updates, NormBound())
    assert bounded.bound == pytest.approx(2.0 * 2.5)  # median of 1, 2, 3, 1e6
    assert bounded.clipped == ["p3"] and bounded.rejected == []
    assert [u.participant for u in bounded.updates] == ["p0", "p1", "p2", "p3"]
    assert update_norm(bounded.updates[3].delta) == pytest.approx(5.0)
    assert bounded.updates[0] is updates[0]  # within the bound: untouched
    assert torch.equal(bounded.updates[3].delta["steps"], torch.tensor(7))


def test_reject_drops_and_an_absolute_bound_and_none_are_honoured() -> None:
    updates = [_update("p0", 1.0), _update("p1", 50.0), _update("p2", 2.0)]
    rejected = bound_updates(updates, NormBound(policy="reject"))
    assert rejected.rejected == ["p1"] and [u.participant for u in rejected.updates] == ["p0", "p2"]
    absolute = bound_updates(updates, NormBound(policy="reject", bound=1.5))
    assert absolute.rejected == ["p1", "p2"]
    everyone_over = bound_updates(updates, NormBound(policy="reject", bound=0.5))
    assert everyone_over.rejected == [] and everyone_over.clipped == ["p0", "p1", "p2"]  # never empty
    lone = bound_updates([_update("p9", 1e6)], NormBound(policy="reject"), history=[1.0, 1.2, 0.9])
    assert lone.clipped == ["p9"] and update_norm(lone.updates[0].delta) == pytest.approx(2 * 1.1)
    assert bound_updates(updates, NormBound(policy="none")).updates == updates
    assert round_bound([0.0, 0.0, 5.0], NormBound()) == math.inf  # a zero median bounds nothing


def test_clip_or_reject_clips_a_rich_member_s_larger_update_and_rejects_an_outsized_one() -> None:
    """An honest member with several times the others' data sends a few times their norm (clipped: it
    stays in the round); a boosted update is rejected; and a round of outsized updates is not emptied."""
    rule = NormBound(policy="clip-or-reject", reject_multiple=4.0)
    typical = [_update(f"p{i}", 1.0) for i in range(5)]
    rich, edge, boosted = _update("rich", 5.0), _update("edge", 7.9), _update("boosted", 8.1)
    bounded = bound_updates([*typical, rich, edge, boosted], rule)
    assert bounded.bound == pytest.approx(2.0)  # 2 x the median of 1 (x5), 5, 7.9, 8.1
    assert bounded.clipped == ["rich", "edge"] and bounded.rejected == ["boosted"]  # the line: 4 x 2
    assert [update_norm(u.delta) for u in bounded.updates[5:]] == [pytest.approx(2.0)] * 2
    # the same updates under the other policies: reject loses the rich member, clip keeps the boosted one
    assert bound_updates([*typical, rich], NormBound(policy="reject")).rejected == ["rich"]
    assert bound_updates([*typical, boosted], NormBound(policy="clip")).clipped == ["boosted"]
    # the multiple is the rule's own, and an absolute bound is honoured
    assert bound_updates(
        [*typical, rich], NormBound(policy="clip-or-reject", reject_multiple=2.0)
    ).rejected == ["rich"]
    absolute = bound_updates([*typical, rich], NormBound(policy="clip-or-reject", bound=0.5))
    assert absolute.clipped == [f"p{i}" for i in range(5)] and absolute.rejected == ["rich"]
    everyone_far_over = bound_updates([_update("p9", 1e6)], rule, history=[1.0, 1.2, 0.9])
    assert everyone_far_over.clipped == ["p9"] and everyone_far_over.rejected == []


def test_keep_clipped_keeps_the_eligible_clipped_updates_and_never_empties_a_round() -> None:
    updates = [*(_update(f"p{i}", 1.0) for i in range(3)), _update("rich", 5.0), _update("other", 5.0)]
    bounded = bound_updates(updates, NormBound(policy="clip-or-reject"))
    assert bounded.clipped == ["rich", "other"]
    kept = keep_clipped(bounded, {"rich", "p0"})
    assert kept.clipped == ["rich"] and kept.rejected == ["other"]
    assert [u.participant for u in kept.updates] == ["p0", "p1", "p2", "rich"]
    assert keep_clipped(bounded, set()).rejected == ["rich", "other"]
    only_clipped = bound_updates([_update("a", 5.0)], NormBound(policy="clip-or-reject"), history=[1.0] * 3)
    assert keep_clipped(only_clipped, set()) == only_clipped  # a round is never emptied
    unclipped = bound_updates(updates[:3], NormBound(policy="clip-or-reject"))
    assert keep_clipped(unclipped, set()) == unclipped


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"policy": "drop"}, "update_norm_policy"),
        ({"bound": -1.0}, "update_norm_bound"),
        ({"bound": math.inf}, "update_norm_bound"),
        ({"multiple": 0.5}, "update_norm_multiple"),
        ({"multiple": math.nan}, "update_norm_multiple"),
        ({"reject_multiple": 0.5}, "update_norm_reject_multiple"),
        ({"reject_multiple": math.inf}, "update_norm_reject_multiple"),
    ],
)
def test_bad_bounds_name_the_setting(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        NormBound(**kwargs)  # type: ignore[arg-type]


def test_scale_corruption_round_trips() -> None:
    assert parse_corruption("scale:1e6").delta_scale == 1e6
    assert parse_corruption("flip:0.1+scale:-3").describe() == "flip:0.1+scale:-3"
    with pytest.raises(ValueError, match="scale must be finite"):
        parse_corruption("scale:inf")


def test_an_update_whose_norm_overflows_is_rejected_even_under_clip() -> None:
    """Finite entries whose squares overflow: clipped by bound / inf it would be a zero delta with a
    FedAvg weight (diluting the round); it is rejected instead, unless no update is finite."""
    huge = ClientUpdate("p9", {"w": torch.full((4,), 1e200, dtype=torch.float64)}, 10)
    updates = [_update("p0", 1.0), _update("p1", 2.0), huge]
    bounded = bound_updates(updates, NormBound(policy="clip"))
    assert bounded.rejected == ["p9"] and math.isinf(bounded.norms["p9"])
    assert [u.participant for u in bounded.updates] == ["p0", "p1"]
    alone = bound_updates([huge], NormBound(policy="clip"), history=[1.0, 2.0])
    assert [u.participant for u in alone.updates] == ["p9"]  # never emptied
