"""The update guard: weights capped, norms with memory, the direction check; honest rounds left alone."""

from __future__ import annotations

import json

import pytest
import torch

from fedsv.fl.state import fedavg
from fedsv.fl.update_bounds import NormBound, bound_updates, typical_norm
from fedsv.fl.update_guard import GuardMemory, GuardSettings, cap_counts, guard_updates
from fedsv.fl.update_screen import WORSE_SIGMAS, worse_by
from fedsv.fl.updates import ClientUpdate
from tests.support.toy_referee import DIM, toy_round


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
    updates, referee = toy_round(seed=m, m=m)
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
        updates, referee = toy_round(seed, m, signal=0.05 + 0.01 * (seed % 30))
        guarded = guard_updates(
            updates, NormBound(policy="reject"), GuardSettings(), memory, [100] * 12, referee
        )
        assert guarded.updates == updates, seed
        assert not (guarded.turned_away or guarded.capped or guarded.bounded.rejected)


@pytest.mark.parametrize("rider", ["zero", "noise", "noise at the honest norm", "zero, 10^7 declared"])
@pytest.mark.parametrize("m", [2, 3, 5])
def test_a_free_riders_null_update_is_turned_away(rider: str, m: int) -> None:
    updates, referee = toy_round(seed=10 + m, m=m)
    honest_norm = float(updates[0].delta["w"].norm())
    noise = torch.randn(DIM, generator=torch.Generator().manual_seed(m), dtype=torch.float64)
    null = {
        "zero": torch.zeros(DIM, dtype=torch.float64),
        "noise": 0.01 * noise / noise.norm(),
        "noise at the honest norm": honest_norm * noise / noise.norm(),
        "zero, 10^7 declared": torch.zeros(DIM, dtype=torch.float64),
    }[rider]
    count = 10**7 if "declared" in rider else 100
    riders = [*updates[:-1], ClientUpdate("p999", {"w": null}, count)]
    guarded = guard_updates(riders, NormBound(), GuardSettings(), GuardMemory(), [100] * 6, referee)
    if rider == "noise at the honest norm":  # as large as an honest update: a noise attacker, not null
        assert not guarded.null
        return
    assert set(guarded.null) == {"p999"} and not guarded.turned_away and not guarded.worse
    assert [u.participant for u in guarded.updates] == [u.participant for u in updates[:-1]]


def test_a_round_of_only_null_updates_moves_nothing_and_keeps_one() -> None:
    zeros = [ClientUpdate(f"p{i}", {"w": torch.zeros(DIM, dtype=torch.float64)}, 100) for i in range(3)]
    _, referee = toy_round(seed=3, m=3)
    guarded = guard_updates(zeros, NormBound(), GuardSettings(), GuardMemory(), [100] * 3, referee)
    assert guarded.updates == zeros and not guarded.null  # never all: the aggregate is w_t


@pytest.mark.parametrize(("m", "colluders"), [(3, 2), (5, 2), (5, 3), (10, 3)])
@pytest.mark.parametrize("scale", ["-3x the others' mean", "that direction at their own norm"])
def test_colluders_that_agree_with_each_other_are_dropped_when_their_round_is_worse(
    m: int, colluders: int, scale: str
) -> None:
    """Colluders all send -3x the honest updates' mean: each one's "others" is dominated by its partners,
    so the direction check passes them, but the round's FedAvg is worse than w_t and theirs point away
    from the descent. They are dropped until the round is not worse (three of five may leave one, whose
    weight then only slows the honest step); no honest update is."""
    updates, referee = toy_round(seed=20 + m, m=m)
    honest = updates[: m - colluders]
    mean = torch.stack([u.delta["w"] for u in honest]).mean(0)
    attack = -3 * mean
    if scale != "-3x the others' mean":
        attack = attack / attack.norm() * honest[0].delta["w"].norm()
    rng = torch.Generator().manual_seed(m)  # each its own speck of noise: not one vector (identical_updates)
    speck = 1e-3 * attack.norm() / DIM**0.5
    bad = [
        ClientUpdate(f"p9{i:02d}", {"w": attack + speck * torch.randn(DIM, generator=rng)}, 100)
        for i in range(colluders)
    ]
    guarded = guard_updates([*honest, *bad], NormBound(), GuardSettings(), GuardMemory(), [100] * m, referee)
    kept = [u.participant for u in guarded.updates]
    assert kept[: len(honest)] == [u.participant for u in honest] and not guarded.identical
    dropped = set(guarded.worse) | set(guarded.turned_away) | set(guarded.bounded.rejected)
    assert dropped <= {u.participant for u in bad} and len(dropped) >= colluders - 1
    if colluders < len(honest):  # a minority of the round: every colluder goes
        assert dropped == {u.participant for u in bad}
    zero = {"w": torch.zeros(DIM, dtype=torch.float64)}
    assert referee.loss(fedavg([u.delta for u in guarded.updates], [100] * len(kept))) < referee.loss(zero)


def test_a_round_worse_for_updates_along_the_descent_is_left_alone() -> None:
    """Every update overshoots the target (2.5x its step): the round is worse than w_t, but nothing
    points against the descent, so nothing is dropped (a skewed or too-large honest round)."""
    updates, referee = toy_round(seed=5, m=4, signal=2.5)
    guarded = guard_updates(updates, NormBound(), GuardSettings(), GuardMemory(), [100] * 4, referee)
    assert guarded.updates == updates and not guarded.worse


def test_at_least_one_update_remains_and_direction_can_be_turned_off() -> None:
    updates, referee = toy_round(seed=1, m=3)
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


@pytest.mark.parametrize("m", [5, 8])  # honest updates the majority: the median is theirs
def test_clip_or_reject_keeps_a_rich_member_clipped_and_drops_other_large_updates(m: int) -> None:
    """Under the default policy a member with four times the others' data (its update 4x theirs, along
    the descent) is clipped and stays in the round. Dropped: the same norm against the descent (a
    colluder sending -3x its update, which a norm alone cannot tell from the rich member), the same
    norm along it from a member of ordinary size (label noise makes larger steps), and a rich member's
    update against the descent, whatever the direction check would make of them; "reject" drops all."""
    updates, referee = toy_round(seed=10 + m, m=m)
    rich = ClientUpdate("rich", {"w": 4 * updates[0].delta["w"]}, 400)
    colluder = ClientUpdate("colluder", {"w": -3 * updates[1].delta["w"]}, 100)
    noisy = ClientUpdate("noisy", {"w": 4 * updates[2].delta["w"]}, 100)
    reversed_rich = ClientUpdate("reversed", {"w": -4 * updates[0].delta["w"]}, 400)
    rnd = [*updates, rich, colluder, noisy, reversed_rich]
    counts = [100] * 8 + [400, 400]
    rule = NormBound(policy="clip-or-reject")
    off = GuardSettings(direction=False, quarantine=False)  # the norm bound's own decision
    guarded = guard_updates(rnd, rule, off, GuardMemory(), counts, referee)
    assert guarded.bounded.clipped == ["rich"]
    assert guarded.bounded.rejected == ["colluder", "noisy", "reversed"]
    assert [u.participant for u in guarded.updates] == [*(u.participant for u in updates), "rich"]
    assert torch.linalg.vector_norm(guarded.updates[-1].delta["w"]) == pytest.approx(guarded.bounded.bound)
    rejecting = guard_updates(rnd, NormBound(policy="reject"), off, GuardMemory(), counts, referee)
    assert rejecting.bounded.rejected == ["rich", "colluder", "noisy", "reversed"]
    # without a referee, or without declared counts, there is nothing to tell them by: all are dropped
    for blind in (
        guard_updates(rnd, rule, off, GuardMemory(), counts, None),
        guard_updates(rnd, rule, off, GuardMemory(), [], referee),
    ):
        assert (
            blind.bounded.rejected == ["rich", "colluder", "noisy", "reversed"]
            and blind.bounded.clipped == []
        )


@pytest.mark.parametrize(("m", "colluders"), [(3, 2), (5, 3), (10, 5)])
def test_a_little_is_enough_colluders_along_the_descent_are_dropped_when_their_round_is_worse(
    m: int, colluders: int
) -> None:
    """ALIE colluders send one vector: their honest mean plus a large coordinate-wise spread. It points
    along the descent (the direction check and the tolerance pass it), but it makes the round's FedAvg
    worse than w_t by itself: the round referee drops the agreeing updates whose leave-one-out effect is
    harmful, until the round is not worse. No honest update is dropped. (Four such colluders of ten whose
    round is worse by 7.6 standard errors are not caught: each one's leave-one-out effect, with three
    copies left, stays within the noise; their reputation is what acts on them.)"""
    updates, referee = toy_round(seed=40 + m, m=m)
    honest = updates[: m - colluders]
    mean = torch.stack([u.delta["w"] for u in honest]).mean(0)
    spread = torch.randn(DIM, generator=torch.Generator().manual_seed(m), dtype=torch.float64).abs()
    attack = mean + spread / spread.norm() * 5 * honest[0].delta["w"].norm()
    cosine = float(attack @ referee.descent()["w"]) / float(attack.norm() * referee.descent()["w"].norm())
    assert cosine > 0  # along the descent
    rng = torch.Generator().manual_seed(m)  # each its own speck of noise: not one vector (identical_updates)
    speck = 1e-3 * attack.norm() / DIM**0.5
    bad = [
        ClientUpdate(f"p9{i:02d}", {"w": attack + speck * torch.randn(DIM, generator=rng)}, 100)
        for i in range(colluders)
    ]
    guarded = guard_updates([*honest, *bad], NormBound(), GuardSettings(), GuardMemory(), [100] * m, referee)
    kept = [u.participant for u in guarded.updates]
    assert kept[: len(honest)] == [u.participant for u in honest] and not guarded.identical
    dropped = set(guarded.worse) | set(guarded.turned_away) | set(guarded.bounded.rejected)
    assert set(guarded.worse) and dropped <= {u.participant for u in bad}
    base = referee.losses({"w": torch.zeros(DIM, dtype=torch.float64)})
    assert worse_by(referee, base, [*honest, *bad]) > WORSE_SIGMAS >= worse_by(referee, base, guarded.updates)
