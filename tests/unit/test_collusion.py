"""Colluding attacks: ALIE and IPM against their closed forms, the spec, and the group a run gives them."""

from __future__ import annotations

import pytest
import torch

from fedsv.data.collusion import FACTORS, colluded_update
from fedsv.data.corruptions import parse_corruption
from fedsv.settings.run import RunConfig


def _honest() -> list[dict[str, torch.Tensor]]:
    return [
        {"w": torch.tensor([1.0, 0.0, 2.0]), "steps": torch.tensor(3)},
        {"w": torch.tensor([3.0, 0.0, 2.0]), "steps": torch.tensor(3)},
        {"w": torch.tensor([2.0, 3.0, 2.0]), "steps": torch.tensor(3)},
    ]


def test_alie_is_the_mean_plus_tau_sample_deviations_and_ipm_minus_tau_means() -> None:
    honest = _honest()
    alie = colluded_update("alie", 1.5, honest)["w"]
    # mean (2, 1, 2); sample SD (1, sqrt(3), 0)
    assert torch.allclose(alie, torch.tensor([2.0 + 1.5, 1.0 + 1.5 * 3**0.5, 2.0]))
    ipm = colluded_update("ipm", 2.0, honest)["w"]
    assert torch.allclose(ipm, torch.tensor([-4.0, -2.0, -4.0]))
    assert colluded_update("ipm", 2.0, honest)["steps"] == 3  # integer buffers travel as they are
    alone = colluded_update("alie", 1.5, honest[:1])["w"]  # a group of one: no spread
    assert torch.equal(alone, honest[0]["w"])


def test_an_unknown_attack_or_no_honest_update_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown colluding attack"):
        colluded_update("krum", 1.0, _honest())
    with pytest.raises(ValueError, match="at least one honest update"):
        colluded_update("alie", 1.0, [])


def test_the_spec_reads_attacks_factors_and_groups_and_writes_them_back() -> None:
    alie = parse_corruption("alie")
    assert (alie.collude, alie.collude_factor, alie.delta_scale) == ("alie", FACTORS["alie"], 1.0)
    ipm = parse_corruption("ipm:0.5+group:3,1")
    assert (ipm.collude, ipm.collude_factor, ipm.group) == ("ipm", 0.5, (1, 3))
    assert parse_corruption(ipm.describe()) == ipm and not ipm.is_clean and ipm.trains
    for bad in ("alie:x", "ipm:inf", "group:", "group:a,2"):
        with pytest.raises(ValueError, match="bad corruption"):
            parse_corruption(bad)


def test_a_runs_colluding_entry_makes_its_ranks_one_group() -> None:
    run = RunConfig(participants=6, corrupt="1-2=alie;4=ipm:1+group:4,5;0=scale:-1")
    spec = run.corruptions()
    assert spec[1] == spec[2] == "alie+group:1,2"
    assert parse_corruption(spec[1]).group == (1, 2)
    assert parse_corruption(spec[4]).group == (4, 5) and spec[0] == "scale:-1"
    with pytest.raises(ValueError, match="group names a rank"):
        RunConfig(participants=3, corrupt="1=alie+group:1,7")
