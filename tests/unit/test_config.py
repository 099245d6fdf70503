"""RunConfig's checks: corruptions and the fixed per-round selection used to replay a run."""

from __future__ import annotations

import pytest

from fedsv.coordinator.config import RunConfig


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
