"""Selection: the balanced schedule's counts, determinism and restarts; the independent draw kept; the
warning before a run that leaves members unselected; reruns simulated by the run's rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsv.fl.selection import balanced_schedule, select_ranks, selection_counts
from fedsv.ledger import drew_balanced
from fedsv.settings.choices import Draw
from fedsv.settings.run import RunConfig
from fedsv.valuation.errors.noise_persistence import TrainingNoise
from fedsv.valuation.errors.rerun_noise import replicates

SHAPES = [(20, 10, 5), (6, 3, 8), (7, 3, 5), (10, 1, 3), (5, 5, 2), (13, 4, 9), (50, 10, 7)]


@pytest.mark.parametrize(("n", "k", "t"), SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_member_is_selected_floor_or_ceil_of_tk_over_n_times(n: int, k: int, t: int, seed: int) -> None:
    schedule = balanced_schedule(seed, n, k, t)
    assert len(schedule) == t
    for ranks in schedule:
        assert len(ranks) == k and len(set(ranks)) == k and ranks == sorted(ranks)
        assert all(0 <= r < n for r in ranks)
    counts = selection_counts(schedule, n)
    assert set(counts) <= {t * k // n, math.ceil(t * k / n)}, counts
    assert sum(counts) == t * k


def test_the_independent_draw_is_not_balanced_where_the_balanced_one_is() -> None:
    """The default federation (20 members, 10 per round, 5 rounds): the independent draw leaves some
    member out in about half of the seeds; the balanced schedule never does."""
    missed = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        drawn = [select_ranks(rng, 20, 10) for _ in range(5)]
        missed += min(selection_counts(drawn, 20)) == 0
        assert min(selection_counts(balanced_schedule(seed, 20, 10, 5), 20)) >= 2
    assert missed >= 8


def test_the_schedule_follows_the_seed_and_a_longer_run_starts_with_a_shorter_one() -> None:
    assert balanced_schedule(3, 20, 10, 6) == balanced_schedule(3, 20, 10, 6)
    assert balanced_schedule(3, 20, 10, 6) != balanced_schedule(4, 20, 10, 6)
    assert balanced_schedule(3, 20, 7, 9)[:4] == balanced_schedule(3, 20, 7, 4)
    with pytest.raises(ValueError, match="per_round"):
        balanced_schedule(0, 5, 6, 1)


def test_a_restarted_selector_selects_what_the_uninterrupted_one_does() -> None:
    run = RunConfig(participants=9, fraction=0.4, rounds=8, seed=11)
    assert run.draw == Draw.BALANCED  # the default
    whole = run.selector()
    uninterrupted = [whole.ranks(t) for t in range(1, 9)]
    assert uninterrupted == balanced_schedule(11, 9, run.selected_per_round, 8)
    first = run.selector()
    before = [first.ranks(t) for t in range(1, 4)]
    restarted = run.selector()  # a restart: a new selector, asked from round 4 on
    assert before + [restarted.ranks(t) for t in range(4, 9)] == uninterrupted


def test_the_independent_draw_and_a_fixed_selection_are_kept() -> None:
    paper = RunConfig(participants=8, fraction=0.5, rounds=3, seed=2, draw=Draw.INDEPENDENT)
    rng = np.random.default_rng(2)
    assert [paper.selector().ranks(1)] == [select_ranks(rng, 8, 4)]
    fixed = RunConfig(participants=8, fraction=0.5, rounds=2, seed=2, selection="1=0-3;2=4-7")
    selector = fixed.selector()
    assert [selector.ranks(1), selector.ranks(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_launch_warns_where_some_member_cannot_or_may_not_be_selected() -> None:
    short = RunConfig(participants=8, fraction=0.25, rounds=2)
    assert "4 will never be selected" in (short.selection_warning() or "")
    assert RunConfig(participants=20, fraction=0.5, rounds=5).selection_warning() is None
    paper = RunConfig(participants=20, fraction=0.5, rounds=5, draw=Draw.INDEPENDENT)
    assert "never selected in about 47%" in (paper.selection_warning() or "")


def test_a_run_recorded_before_the_setting_resumes_as_the_independent_draw() -> None:
    """A run's record leaves `draw` out at the behaviour before it (independent), so a run recorded then
    keeps its id; a balanced run records it."""
    assert "draw" not in RunConfig(draw=Draw.INDEPENDENT).to_dict()
    assert RunConfig().to_dict()["draw"] == Draw.BALANCED
    assert not drew_balanced({"participants": 6}) and drew_balanced(RunConfig().to_dict())
    # a record read back is the run it records, not today's default; a process is started with it all
    paper = RunConfig(draw=Draw.INDEPENDENT)
    assert RunConfig.from_record(paper.to_dict()).draw == Draw.INDEPENDENT
    assert RunConfig.from_record(RunConfig().to_dict()).draw == Draw.BALANCED
    assert paper.settings()["draw"] == Draw.INDEPENDENT and set(paper.settings()) == set(
        RunConfig.model_fields
    )


def test_simulated_reruns_select_as_the_run_did() -> None:
    rounds, members = 5, 20
    noise = TrainingNoise(np.zeros((rounds, members)), np.full((rounds, members), 0.01))
    rate = np.ones(members)
    balanced = replicates(noise, [10] * rounds, rate, 0, 50, 0, balanced=True)
    independent = replicates(noise, [10] * rounds, rate, 0, 50, 0)
    counts = np.array([draw.mask.sum(axis=0) for draw in balanced])
    assert set(np.unique(counts)) <= {2, 3}
    assert (np.array([draw.mask.sum(axis=0) for draw in independent]) == 0).any()
    assert len({draw.mask.tobytes() for draw in balanced}) == 50  # each rerun its own schedule
