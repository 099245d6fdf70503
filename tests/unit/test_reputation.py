"""Reputation: members whose updates keep making the validation loss worse are quarantined, then let back."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedsv.fl.reputation import ENTER, LARGEST, MIN_UPDATES, WINDOW, Evidence, Reputation, marginals
from fedsv.fl.state import fedavg
from fedsv.fl.update_bounds import NormBound
from fedsv.fl.update_guard import GuardMemory, GuardSettings, guard_updates
from fedsv.fl.updates import ClientUpdate
from tests.support.toy_referee import DIM, Quadratic, honest_update, toy_round


def test_marginals_are_leave_one_out_for_the_aggregated_and_add_one_for_the_others() -> None:
    updates, referee = toy_round(seed=4, m=4)
    kept, other = updates[:3], updates[3]
    found = marginals(referee, kept, [other])

    def loss(members: list[ClientUpdate]) -> float:
        return referee.loss(fedavg([u.delta for u in members], [u.num_samples for u in members]))

    for u in kept:
        expected = loss(kept) - loss([v for v in kept if v is not u])
        assert found[u.participant].effect == pytest.approx(expected, rel=1e-9)
    assert found[other.participant].effect == pytest.approx(loss(updates) - loss(kept), rel=1e-9)
    difference = referee.losses(updates[3].delta) - referee.losses(
        {"w": torch.zeros(DIM, dtype=torch.float64)}
    )
    alone = marginals(referee, [updates[3]], [])[updates[3].participant]
    assert alone.stderr == pytest.approx(float(difference.std()) / math.sqrt(DIM), rel=1e-9)


def _federation_round(
    seed: int, rounds_rng: torch.Generator, bad: set[str]
) -> tuple[list[ClientUpdate], Quadratic]:
    """Three of six members (p000..p005), honest steps towards the target; the `bad` send -3x the
    honest mean at an honest norm's size."""
    rng = torch.Generator().manual_seed(seed)
    target = torch.randn(DIM, generator=rng, dtype=torch.float64)
    chosen = torch.randperm(6, generator=rounds_rng)[:3].tolist()
    ids = [f"p{i:03d}" for i in sorted(chosen)]
    updates = [honest_update(rng, target, pid, 0.1 + 0.05 * (seed % 5)) for pid in ids]
    honest = [u.delta["w"] for u in updates if u.participant not in bad]
    if honest:
        mean = torch.stack(honest).mean(0)
        attack = -mean / mean.norm() * updates[0].delta["w"].norm()
        updates = [
            ClientUpdate(u.participant, {"w": attack.clone()}, 100) if u.participant in bad else u
            for u in updates
        ]
    return updates, Quadratic(target)


def test_honest_federations_quarantine_no_one_over_many_rounds() -> None:
    memory, order = GuardMemory(), torch.Generator().manual_seed(0)
    for seed in range(80):
        updates, referee = _federation_round(seed, order, set())
        guarded = guard_updates(updates, NormBound(), GuardSettings(), memory, [100] * 6, referee)
        assert not guarded.held and not guarded.reputation.quarantined, seed
        assert set(guarded.evidence) == {u.participant for u in updates}


def test_a_member_that_keeps_harming_is_quarantined_valued_not_aggregated_then_readmitted() -> None:
    memory, order = GuardMemory(), torch.Generator().manual_seed(1)
    attacker = "p002"
    held_rounds, quarantined_at, readmitted_at = 0, None, None
    for seed in range(60):
        bad = {attacker} if seed < 30 else set()  # it turns honest after 30 rounds
        updates, referee = _federation_round(seed, order, bad)
        guarded = guard_updates(updates, NormBound(), GuardSettings(), memory, [100] * 6, referee)
        kept = {u.participant for u in guarded.updates}
        if attacker in guarded.held:  # valued (its add-one effect), not aggregated
            held_rounds += 1
            assert attacker not in kept and attacker in guarded.evidence
            assert guarded.held[attacker] == guarded.evidence[attacker].effect
        if attacker in guarded.reputation.quarantined:
            quarantined_at = seed
            assert guarded.reputation.quarantined[attacker] > ENTER
        if attacker in guarded.reputation.readmitted:
            readmitted_at = seed
        assert kept, seed
        assert not (set(guarded.reputation.quarantined) - {attacker}), seed  # no honest member
    assert quarantined_at is not None and quarantined_at < 30 and held_rounds >= MIN_UPDATES
    assert readmitted_at is not None and readmitted_at >= 30
    assert attacker not in memory.reputation.quarantined


def test_quarantine_never_empties_a_round_and_can_be_turned_off() -> None:
    updates, referee = toy_round(seed=2, m=2)
    memory = GuardMemory()
    memory.reputation.quarantined = {"p000", "p001"}
    guarded = guard_updates(updates, NormBound(), GuardSettings(), memory, [100] * 2, referee)
    assert guarded.updates == updates and not guarded.held
    memory.reputation.quarantined = {"p000"}
    off = guard_updates(updates, NormBound(), GuardSettings(quarantine=False), memory, [100] * 2, referee)
    assert off.updates == updates and not off.held and not off.evidence
    on = guard_updates(updates, NormBound(), GuardSettings(), memory, [100] * 2, referee)
    assert [u.participant for u in on.updates] == ["p001"] and set(on.held) == {"p000"}


def test_the_federations_spread_is_set_by_aggregated_updates_only() -> None:
    """Members turned away cannot widen the spread they are judged against."""
    reputation = Reputation()
    for _ in range(3):
        evidence = {f"p{i}": Evidence(-0.01 * (i + 1), 0.001) for i in range(4)}
        evidence["p9"] = Evidence(50.0, 0.001)  # far out, and not aggregated
        reputation.observe(evidence, [f"p{i}" for i in range(4)])
    assert reputation.spread() == pytest.approx(1.4826 * 0.01, rel=1e-6)
    assert "p9" in reputation.quarantined


def _colluding_rounds(reputation: Reputation, rounds: int) -> None:
    """Six members, all aggregated every round: four honest ones whose effects spread over
    -0.4..+0.2 (a skewed non-IID federation: helpful on average, harmful now and then), and a pair
    whose effects are +1.2 and +1.4 (colluders, aggregated together: they widen everyone's spread)."""
    honest = [-0.4, -0.2, 0.0, 0.2]
    for t in range(rounds):
        shift = [honest[(i + t) % 4] for i in range(4)]
        evidence = {f"h{i}": Evidence(shift[i], 0.02) for i in range(4)}
        evidence |= {"c1": Evidence(1.2, 0.02), "c2": Evidence(1.4, 0.02)}
        reputation.observe(evidence, sorted(evidence))


def test_colluders_that_widen_the_spread_are_still_quarantined() -> None:
    """Measured over everyone, the pair's own effects widen the spread (MAD over 0.4) until neither
    scores over ENTER; measured over the members not under suspicion (mean effect <= 0) it stays the
    honest members' (0.3), and both are caught. No honest member is."""
    reputation = Reputation()
    _colluding_rounds(reputation, 3)
    assert reputation.quarantined == {"c1", "c2"}
    assert reputation.suspects() == {"c1", "c2"}
    effects = [e for r in reputation.spreads for e in r.values()]
    middle = sorted(effects)[len(effects) // 2]
    everyone = 1.4826 * sorted(abs(e - middle) for e in effects)[len(effects) // 2]
    assert 1.2 / math.sqrt((0.02**2 + everyone**2) / WINDOW) < ENTER  # hidden in a spread of everyone
    assert reputation.spread() == pytest.approx(1.4826 * 0.2, rel=1e-6)


def test_suspects_and_quarantine_stay_a_minority() -> None:
    """One member's larger helpful step makes every other member's leave-one-out effect harmful (the
    coordinator's task test: 4 members, one with most of the data): only a minority of them is suspect
    (the worst), harm is measured from the others' level, so none is quarantined; and however the
    scores fall, fewer than half of the members seen are quarantined at once."""
    reputation = Reputation()
    for t in range(4):
        evidence = {f"h{i}": Evidence(0.010 + 0.004 * ((i + t) % 5), 0.003) for i in range(5)}
        evidence["big"] = Evidence(-0.08, 0.005)
        reputation.observe(evidence, sorted(evidence))
        assert len(reputation.suspects()) <= reputation.minority() == 2, t
        assert not reputation.quarantined, t
    assert reputation.level() > 0.01
    crowd = Reputation()
    for _ in range(3):
        crowd.observe(
            {f"m{i}": Evidence(1.0 + i, 0.001) for i in range(7)}, []
        )  # all harmful, none aggregated
    assert len(crowd.quarantined) == crowd.minority() == 3
    assert crowd.quarantined == {"m4", "m5", "m6"}  # the worst first


def test_reputation_survives_a_checkpoint_and_rejects_malformed_state() -> None:
    reputation = Reputation()
    for t in range(4):
        reputation.observe(
            {"a": Evidence(1.0 + t, 0.1), "b": Evidence(-0.1, 0.1), "c": Evidence(0.0, 0.1)}, ["b", "c"]
        )
    memory = GuardMemory(reputation=reputation)
    restored = GuardMemory.from_json(json.loads(json.dumps(memory.to_json())))
    assert restored.reputation.to_json() == reputation.to_json() and restored.reputation.quarantined == {"a"}
    assert GuardMemory.from_json({}).reputation.quarantined == set()  # checkpoints from before reputation
    older = {"history": {"a": [[1.0, 0.1]]}, "spreads": [[0.5, -0.5]], "quarantined": ["a"]}
    read = GuardMemory.from_json({"reputation": older}).reputation  # round effects kept without members
    assert read.quarantined == {"a"} and sorted(read.spreads[0].values()) == [-0.5, 0.5]
    with pytest.raises(ValueError, match="malformed"):
        GuardMemory.from_json({"reputation": {"history": 3}})


def test_an_update_that_overflows_the_loss_is_finite_evidence_of_harm() -> None:
    """An update far over the norm bound (turned away, so valued add-one) overflows the loss: its
    evidence is the largest harm, finite, so the ledger and the checkpoint keep it."""
    updates, referee = toy_round(seed=6, m=3)
    huge = ClientUpdate("p009", {"w": torch.full((DIM,), 1e200, dtype=torch.float64)}, 100)
    found = marginals(referee, updates, [huge])["p009"]
    assert found.effect == LARGEST and math.isfinite(found.stderr)
    guarded = guard_updates([*updates, huge], NormBound(), GuardSettings(), GuardMemory(), [100] * 4, referee)
    assert "p009" not in {u.participant for u in guarded.updates}
    assert guarded.evidence["p009"].effect == LARGEST
