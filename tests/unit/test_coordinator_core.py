"""The coordinator's core without sockets: sessions (who may act, how many calls) and the round board."""

from __future__ import annotations

import functools
import threading
from types import SimpleNamespace

import pytest
import torch

from fedsv.coordinator import round_board
from fedsv.coordinator.refusals import Refusal
from fedsv.coordinator.round_board import OpenRound, RoundBoard
from fedsv.coordinator.run_end import FINISHED
from fedsv.coordinator.sessions import ParticipantInfo, Rejected, Sessions


def _refused(reason: Refusal, call: object, *args: object, **kwargs: object) -> None:
    with pytest.raises(Rejected) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    assert caught.value.reason is reason


def test_join_checks_who_may_act_and_a_rejoin_replaces_the_session() -> None:
    sessions = Sessions(4, "secret", tokens={"p001": "t1"}, max_samples=100)
    _refused(Refusal.BAD_CREDENTIAL, sessions.join, 1, 4, "wrong", "h", "t1", None, 10)
    _refused(Refusal.WRONG_WORLD_SIZE, sessions.join, 1, 5, "secret", "h", "t1", None, 10)
    _refused(Refusal.BAD_RANK, sessions.join, 4, 4, "secret", "h", "t1", None, 10)
    _refused(Refusal.BAD_SAMPLE_COUNT, sessions.join, 1, 4, "secret", "h", "t1", None, 101)
    _refused(Refusal.BAD_PARTICIPANT_TOKEN, sessions.join, 1, 4, "secret", "h", "nope", None, 10)
    _refused(Refusal.WRONG_IDENTITY, sessions.join, 1, 4, "secret", "h", "t1", "p002", 10)
    first = sessions.join(1, 4, "secret", "h", "t1", None, 10)
    assert sessions.authenticate("p001", first.token) == first and sessions.declared_counts() == [10]
    again = sessions.join(1, 4, "secret", "h", "t1", None, 12)
    assert not sessions.is_current("p001", first.token) and sessions.is_current("p001", again.token)
    _refused(Refusal.BAD_TOKEN, sessions.authenticate, "p001", first.token)
    _refused(Refusal.UNKNOWN_PARTICIPANT, sessions.authenticate, "p003", first.token)
    assert sessions.declared_counts() == [12] and sessions.joined() == 1
    strict = Sessions(2, require_peer=True)
    _refused(Refusal.NO_CERTIFICATE, strict.join, 0, 2, "", "h")


def test_calls_are_capped_per_participant_and_task_streams_per_run() -> None:
    sessions = Sessions(3, max_streams=2, max_participants=1)
    seen: list[int] = []
    sessions.on_connected = seen.append
    undeclared = sessions.join(0, 3, "", "h")
    _refused(Refusal.UNDECLARED_SAMPLES, sessions.open_call, undeclared, "Subscribe")
    one, two = sessions.join(0, 3, "", "h", num_samples=5), sessions.join(1, 3, "", "h", num_samples=5)
    sessions.open_call(one, "Subscribe")
    sessions.open_call(one, "Subscribe")  # a second stream of the same participant: no new participant
    _refused(Refusal.TOO_MANY_STREAMS, sessions.open_call, one, "Subscribe")
    _refused(Refusal.TOO_MANY_PARTICIPANTS, sessions.open_call, two, "Subscribe")
    assert sessions.connected() == 1 and seen == [1, 1]
    sessions.close_call(one, "Subscribe")
    sessions.close_call(one, "Subscribe")
    assert sessions.connected() == 0 and sessions.open_calls == {} and seen[-1] == 0
    sessions.open_call(two, "Subscribe")  # room again
    stop = threading.Event()
    assert sessions.wait_for_participants(1, deadline=float("inf"), stop=stop)
    stop.set()
    assert not sessions.wait_for_participants(2, deadline=float("inf"), stop=stop)


def _open(board: RoundBoard, number: int, selected: list[str], deadline: float) -> OpenRound:
    opened = OpenRound(number, selected, deadline, {"w": torch.zeros(2)}, dict.fromkeys(selected, 7))
    board.open_round(opened)
    return opened


def _info(sessions: Sessions, rank: int, samples: int = 10) -> ParticipantInfo:
    return sessions.join(rank, 4, "", "h", num_samples=samples)


def test_the_board_admits_one_update_per_selected_participant_of_the_open_round() -> None:
    board, sessions = RoundBoard(), Sessions(4)
    woken: list[str] = []
    for pid in ("p000", "p001", "p002", "p003"):
        board.listen(pid, functools.partial(woken.append, pid))
    one, two, three = _info(sessions, 0), _info(sessions, 1), _info(sessions, 3)
    _refused(Refusal.WRONG_ROUND, board.check_update, one, 1, 10)
    opened = _open(board, 1, ["p000", "p001"], deadline=float("inf"))
    assert woken == ["p000", "p001"]  # only the selected are woken
    assert board.task_for("p000", 0) is opened and board.task_for("p000", 1) is None
    assert board.task_for("p003", 0) is None
    _refused(Refusal.NOT_SELECTED, board.check_update, three, 1, 10)
    _refused(Refusal.SAMPLE_COUNT_MISMATCH, board.check_update, one, 1, 11)
    _refused(Refusal.BAD_HEADER, board.check_update, one, 1, 0)
    _refused(Refusal.WRONG_ROUND, board.check_update, one, 2, 10)
    delta = {"w": torch.ones(2)}
    board.accept_update(one, 1, delta, 10, 1.5)
    _refused(Refusal.DUPLICATE, board.accept_update, one, 1, delta, 10, 1.0)
    _refused(Refusal.BAD_HEADER, board.accept_update, two, 1, delta, 10, float("nan"))
    assert board.task_for("p000", 0) is None  # it reported
    closed = board.close_round()
    _refused(Refusal.ROUND_CLOSED, board.check_update, two, 1, 10)
    assert list(closed.received) == ["p000"] and closed.received["p000"].train_seconds == 1.5
    board.finish(FINISHED, 1)
    assert board.finished and board.end_reason == "finished" and board.poll("p003", 0).finished
    assert set(woken[2:]) == {"p000", "p001", "p002", "p003"}  # the end wakes everyone


def test_a_round_waits_for_everyone_or_a_quorum_after_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(round_board, "time", SimpleNamespace(time=lambda: clock.now))
    board, sessions, stop = RoundBoard(), Sessions(4), threading.Event()
    infos = [_info(sessions, r) for r in range(3)]
    selected = ["p000", "p001", "p002"]
    opened = _open(board, 1, selected, deadline=110.0)
    board.accept_update(infos[0], 1, {"w": torch.ones(1)}, 10, 0.0)
    clock.now = 111.0  # past the deadline with 1 of the 2 needed, before the hard deadline
    board.refuse_update(infos[1], 1, "non_finite")  # refused for what it held: reported
    clock.now = 200.0
    assert not board.wait_for_updates(opened, need=2, hard_deadline=150.0, stop=stop)
    assert opened.refused == {"p001": "non_finite"}
    board.accept_update(infos[1], 1, {"w": torch.ones(1)}, 10, 0.0)
    assert opened.refused == {}  # a corrected update, in time, counts
    assert board.wait_for_updates(opened, need=2, hard_deadline=150.0, stop=stop)  # quorum after deadline
    clock.now = 100.0
    early = _open(board, 2, selected, deadline=110.0)
    for info in infos:
        board.accept_update(info, 2, {"w": torch.ones(1)}, 10, 0.0)
    assert board.wait_for_updates(early, need=3, hard_deadline=150.0, stop=stop)  # all in: no wait
    late = _open(board, 3, selected, deadline=110.0)
    board.accept_update(infos[0], 3, {"w": torch.ones(1)}, 10, 0.0)
    board.refuse_update(infos[1], 3, "non_finite")
    board.refuse_update(infos[2], 3, "too_large")
    assert board.wait_for_updates(late, need=1, hard_deadline=150.0, stop=stop)  # the rest refused
    stop.set()
    assert not board.wait_for_updates(_open(board, 4, selected, 110.0), 1, 150.0, stop)
