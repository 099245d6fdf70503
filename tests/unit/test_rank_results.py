"""A rank's end, typed: the participant's exit status follows its kind, and the logs keep their words."""

from __future__ import annotations

from fedsv.participant.results import FINISHED, STOPPED, RankEnd, RankResult


def test_only_a_finished_run_is_ok_and_each_end_reads_as_before() -> None:
    assert RankResult.from_coordinator("finished") == FINISHED == RankResult.from_coordinator("")
    assert FINISHED.ok and not STOPPED.ok
    ended = RankResult.from_coordinator("no_quorum")
    assert ended.kind is RankEnd.ENDED and not ended.ok and str(ended) == "no_quorum"
    assert str(RankResult(RankEnd.REFUSED, "UNAUTHENTICATED")) == "refused: UNAUTHENTICATED"
    assert str(RankResult(RankEnd.GAVE_UP, "coordinator unreachable")) == "gave up: coordinator unreachable"
    assert str(RankResult(RankEnd.ERROR, "bad data")) == "error: bad data" and str(STOPPED) == "stopped"
    assert not any(RankResult(kind, "x").ok for kind in RankEnd if kind is not RankEnd.FINISHED)
