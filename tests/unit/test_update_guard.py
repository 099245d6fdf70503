"""The update guard: weights capped, norms with memory, the direction check; honest rounds left alone."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pytest
import torch
from torch import Tensor

from fedsv.fl.update_bounds import NormBound, bound_updates, typical_norm
from fedsv.fl.update_guard import GuardMemory, GuardSettings, cap_counts, guard_updates
from fedsv.fl.updates import ClientUpdate

DIM = 200


class Quadratic:
    """A referee whose loss is ||w_t + delta - target||^2: its descent points at the target."""

    def __init__(self, target: Tensor) -> None:
        self.target = target

    def descent(self) -> dict[str, Tensor]:
        return {"w": 2 * self.target}

    def loss(self, delta: Mapping[str, Tensor]) -> float:
        return float(((delta["w"] - self.target) ** 2).sum())


def _honest(rng: torch.Generator, target: Tensor, pid: str, signal: float, count: int = 100) -> ClientUpdate:
    """A step towards the target (a share `signal` of it) plus noise of about the same norm."""
    noise = torch.randn(DIM, generator=rng, dtype=torch.float64)
    step = signal * target + 0.3 * noise * target.norm() / math.sqrt(DIM)
    return ClientUpdate(pid, {"w": step}, count)


def _round(seed: int, m: int, signal: float = 0.3) -> tuple[list[ClientUpdate], Quadratic]:
    rng = torch.Generator().manual_seed(seed)
    target = torch.randn(DIM, generator=rng, dtype=torch.float64)
    return [_honest(rng, target, f"p{i:03d}", signal) for i in range(m)], Quadratic(target)


def test_weights_are_capped_at_a_multiple_of_the_federations_median_count() -> None:
    updates = [ClientUpdate(f"p{i}", {"w": torch.ones(2)}, c) for i, c in enumerate([100, 120, 10**7])]
    capped, which = cap_counts(updates, [100, 110, 120, 90, 10**7], 3.0)
    assert [u.num_samples for u in capped] == [100, 120, 330] and which == {"p2": 10**7}
    assert cap_counts(updates, [100], 0.0)[0] == updates  # off
    same, none = cap_counts(updates[:2], [100, 120, 110], 3.0)
    assert same == updates[:2] and none == {}


def test_two_updates_and_no_history_the_smaller_sets_the_bound() -> None:
    small = ClientUpdate("p0", {"w": torch.ones(4)}, 10)
    huge = ClientUpdate("p1", {"w": torch.ones(4) * 1e6}, 10)
    bounded = bound_updates([small, huge], NormBound(policy="reject"))
    assert bounded.rejected == ["p1"] and bounded.bound == pytest.approx(2 * 2.0)
    assert typical_norm([3.0, 1.0, 2.0, 100.0]) == 2.5 and typical_norm([5.0]) == 5.0
    with_history = bound_updates([huge], NormBound(policy="reject"), history=[2.0, 2.1, 1.9])
    assert with_history.clipped == ["p1"]  # a round of one: the history bounds it (never emptied)


@pytest.mark.parametrize("attack", ["flip", "minus3", "reversed_heavy"])
@pytest.mark.parametrize("m", [2, 3, 5])
def test_an_update_against_the_referee_and_the_round_is_turned_away(attack: str, m: int) -> None:
    updates, referee = _round(seed=m, m=m)
    memory = GuardMemory()
    settings = GuardSettings()
    victim = updates[-1]
    others = updates[:-1]
    if attack == "flip":
        bad = ClientUpdate(victim.participant, {"w": -victim.delta["w"]}, victim.num_samples)
    elif attack == "minus3":
        mean = torch.stack([u.delta["w"] for u in others]).mean(0)
        bad = ClientUpdate(victim.participant, {"w": -3 * mean}, victim.num_samples)
    else:
        bad = ClientUpdate(victim.participant, {"w": -victim.delta["w"]}, 10**7)
    counts = [100] * 6
    guarded = guard_updates([*others, bad], NormBound(policy="reject"), settings, memory, counts, referee)
    gone = set(guarded.turned_away) | set(guarded.bounded.rejected)
    assert gone == {victim.participant}
    assert [u.participant for u in guarded.updates] == [u.participant for u in others]


def test_honest_rounds_stay_fedavg_over_many_rounds_and_participants() -> None:
    """Noisy honest updates of every strength of signal, rounds of 2 to 10: nothing is touched."""
    memory = GuardMemory()
    for seed in range(60):
        m = 2 + seed % 9
        updates, referee = _round(seed, m, signal=0.05 + 0.01 * (seed % 30))
        guarded = guard_updates(
            updates, NormBound(policy="reject"), GuardSettings(), memory, [100] * 12, referee
        )
        assert guarded.updates == updates, seed
        assert not (guarded.turned_away or guarded.capped or guarded.bounded.rejected)


def test_at_least_one_update_remains_and_direction_can_be_turned_off() -> None:
    updates, referee = _round(seed=1, m=3)
    flipped = [ClientUpdate(u.participant, {"w": -u.delta["w"]}, u.num_samples) for u in updates]
    guarded = guard_updates(flipped, NormBound(), GuardSettings(), GuardMemory(), [100] * 3, referee)
    assert len(guarded.updates) >= 1
    off = GuardSettings(count_multiple=0.0, direction=False, history_rounds=0)
    kept = guard_updates(flipped, NormBound(), off, GuardMemory(), [100] * 3, referee)
    assert kept.updates == flipped


def test_memory_tolerates_a_skewed_federation_and_one_participant_cannot_move_it() -> None:
    memory = GuardMemory()
    assert memory.tolerance() == pytest.approx(-0.05)  # until three participants are known
    for i, low in enumerate([0.10, 0.12, 0.08, 0.11, 0.09]):
        memory.learn(f"p{i}", low, 0.2)
    iid = memory.tolerance()
    memory.learn("p9", -0.99, -0.99)  # one participant far out
    assert memory.tolerance() == pytest.approx(iid, abs=0.02) and iid == pytest.approx(-0.05)
    skewed = GuardMemory()
    for i, low in enumerate([0.2, -0.1, -0.3, 0.1, -0.4, 0.0]):
        skewed.learn(f"p{i}", low, 0.1)
    assert skewed.tolerance() < -0.4  # honest updates of skewed shards stray: more is tolerated
    restored = GuardMemory.from_json(json.loads(json.dumps(skewed.to_json())))
    assert restored == skewed
    with pytest.raises(ValueError, match="malformed"):
        GuardMemory.from_json({"norms": 3})


def test_bad_guard_settings_name_the_setting() -> None:
    with pytest.raises(ValueError, match="update_count_multiple"):
        GuardSettings(count_multiple=0.5)
    with pytest.raises(ValueError, match="update_norm_history"):
        GuardSettings(history_rounds=-1)
