"""RunConfig's checks: corruptions and the fixed per-round selection used to replay a run."""

from __future__ import annotations

import os

import pytest

from fedsv.app.launch import Launch, LaunchConfig
from fedsv.settings.choices import ValuationMethod
from fedsv.settings.run import RunConfig
from fedsv.settings.run_settings import DEFAULT_TARGET_STDERR


def test_selection_parses_every_round_into_sorted_ranks() -> None:
    run = RunConfig(participants=6, rounds=2, selection="1=4,0-2; 2=5")
    assert run.schedule() == {1: (0, 1, 2, 4), 2: (5,)}
    assert RunConfig(participants=6, rounds=2).schedule() == {}


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ("1=0-2", "must name every round; missing \\[2\\]"),
        ("1=0;1=1;2=3", "round 1 twice"),
        ("3=0;1=0;2=0", "rounds 1..2"),
        ("1=0;2=9", "out of range for world size 6"),
        ("1:0;2=1", "ROUND=RANKS"),
        ("1=;2=1", "empty rank list"),
    ],
)
def test_bad_selection_is_a_clear_error(selection: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(participants=6, rounds=2, selection=selection)


def test_bad_corruption_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="RANKS=SPEC"):
        RunConfig(participants=6, corrupt="flip:0.1")


def test_valuation_budgets_reach_the_spec_and_bad_ones_are_named() -> None:
    spec = RunConfig(
        valuation=ValuationMethod.SVARM, valuation_budget=500, valuation_budget_seconds=0
    ).valuation_spec(3)
    assert spec is not None
    assert (spec.method, spec.budget, spec.budget_seconds, spec.seed) == ("svarm", 500, None, 3)
    default = RunConfig().valuation_spec(1)
    assert default is not None and default.budget is None and default.budget_seconds is None
    assert default.target_stderr == DEFAULT_TARGET_STDERR and default.targeted
    timed = RunConfig(valuation_budget_seconds=0.5).valuation_spec(1)
    assert timed is not None and timed.budget_seconds == 0.5 and not timed.targeted
    for kwargs, name in [
        ({"valuation_budget": 1}, "valuation_budget"),
        ({"valuation_budget": -5}, "valuation_budget"),
        ({"valuation_budget_seconds": -1.0}, "valuation_budget_seconds"),
        ({"valuation_budget_seconds": float("nan")}, "valuation_budget_seconds"),
        ({"valuation_budget_seconds": float("inf")}, "valuation_budget_seconds"),
        ({"valuation": "shapiq"}, "valuation must be one of"),
        ({"valuation_target_stderr": -0.1}, "valuation_target_stderr"),
        ({"valuation_exact_seconds": 0.0}, "valuation_exact_seconds"),
        ({"valuation_max_evaluations": 1}, "valuation_max_evaluations"),
    ]:
        with pytest.raises(ValueError, match=name):
            RunConfig(**kwargs)  # type: ignore[arg-type]


def test_launch_shares_the_cpus_among_its_processes() -> None:
    run = RunConfig(participants=20)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert Launch(run, LaunchConfig(processes=4)).threads_per_process() == max(1, cpus // 5)
    assert Launch(run, LaunchConfig(processes=4, threads=3)).threads_per_process() == 3
    assert Launch(RunConfig(participants=2), LaunchConfig()).participant_processes() == 2
    with pytest.raises(ValueError, match=r"threads must be a whole number in 0\.\.4096"):
        LaunchConfig(threads=-1)
