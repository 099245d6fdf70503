"""The round board: the open round, the updates it accepted, who is woken for it, and the run's end."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import Tensor

from fedsv.coordinator.refusals import Refusal
from fedsv.coordinator.run_end import RunEnd
from fedsv.coordinator.sessions import ParticipantInfo, Rejected
from fedsv.fl.reputation import Evidence
from fedsv.fl.updates import ClientUpdate


@dataclass(frozen=True)
class ReceivedUpdate(ClientUpdate):
    """An update the servicer accepted: the participant's delta and count, and its own training time."""

    train_seconds: float = 0.0


@dataclass
class OpenRound:
    """The round being trained: w_t, who trains it, and the updates received so far (tensors: the task
    streams encode w_t for the wire, once a round)."""

    round: int
    selected: list[str]
    deadline: float
    params: dict[str, Tensor]  # the global model w_t the selected train from
    train_seeds: dict[str, int]
    received: dict[str, ReceivedUpdate] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # selected participant -> why it was refused
    effects: dict[str, Evidence] = field(default_factory=dict)  # the guard's reputation evidence
    closed: bool = False
    chosen: frozenset[str] = field(init=False, repr=False)  # `selected` as a set: O(1) lookups

    def __post_init__(self) -> None:
        self.chosen = frozenset(self.selected)


@dataclass(frozen=True)
class StreamNews:
    """What a participant's task stream has to send now: its task, or the end of the run, or nothing."""

    task: OpenRound | None
    finished: bool
    rounds_completed: int


class RoundBoard:
    """The open round and the run's end, guarded by one condition variable.

    Task streams are woken through callbacks (`listen`): opening a round calls those of the selected
    participants only, the run's end those of everyone; nothing here runs per connected participant.
    """

    def __init__(self) -> None:
        # Each open task stream registers its own wake-up callback, called only when its participant
        # has news (a task, the run's end): waking every stream on every event would be O(N) each.
        self._listeners: dict[str, set[Callable[[], None]]] = defaultdict(set)
        self.cond = threading.Condition()
        self.current: OpenRound | None = None
        self.rounds_completed = 0
        self.end: RunEnd | None = None
        self.told_end: set[str] = set()  # participants whose task stream carried the run's end

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def end_reason(self) -> str:
        """The end as the participants read it (RunEnd.reason on the wire); "" while the run goes on."""
        return "" if self.end is None else str(self.end)

    def open_round(self, opened: OpenRound) -> None:
        with self.cond:
            self.current = opened
            self.cond.notify_all()
            self._wake(opened.selected)

    def close_round(self) -> OpenRound:
        with self.cond:
            assert self.current is not None
            self.current.closed = True
            closed = self.current
            self.cond.notify_all()
            return closed

    def finish(self, end: RunEnd, rounds_completed: int | None = None) -> None:
        with self.cond:
            self.end = end
            if rounds_completed is not None:
                self.rounds_completed = rounds_completed
            self.cond.notify_all()
            self._wake(list(self._listeners))

    # ------------------------------------------------------------------ task streams
    def listen(self, pid: str, wake: Callable[[], None]) -> None:
        """Call `wake` (from the round loop's thread, so it must only hand over, never block) whenever
        `pid` may have news: a task, or the run's end. Pair with `unlisten`."""
        with self.cond:
            self._listeners[pid].add(wake)

    def unlisten(self, pid: str, wake: Callable[[], None]) -> None:
        with self.cond:
            listeners = self._listeners.get(pid)
            if listeners is not None:
                listeners.discard(wake)
                if not listeners:
                    del self._listeners[pid]

    def wake(self, pids: Iterable[str]) -> None:
        """Wake these participants' task streams (a stream then re-reads what it has to send)."""
        with self.cond:
            self._wake(pids)

    def told(self, pid: str) -> None:
        """`pid`'s task stream has sent it the run's end."""
        with self.cond:
            self.told_end.add(pid)
            self.cond.notify_all()

    def wait_until_told(self, pids: Iterable[str], deadline: float, stop: threading.Event) -> bool:
        """Block until every one of `pids` has been told the run's end; False at `deadline` or on `stop`."""
        waiting = set(pids)
        with self.cond:
            while not waiting <= self.told_end:
                if stop.is_set() or time.time() >= deadline:
                    return False
                self.cond.wait(timeout=0.25)
        return True

    def _wake(self, pids: Iterable[str]) -> None:
        for pid in pids:
            for wake in self._listeners.get(pid, ()):
                wake()

    def poll(self, pid: str, after_round: int) -> StreamNews:
        """What `pid`'s task stream, which was last sent round `after_round`, has to send now."""
        with self.cond:
            return StreamNews(self.task_for(pid, after_round), self.finished, self.rounds_completed)

    def task_for(self, pid: str, after_round: int) -> OpenRound | None:
        """The open round if `pid` is selected in it, has not reported, and was not sent it yet."""
        current = self.current
        if current is None or current.closed or current.round <= after_round:
            return None
        if pid not in current.chosen or pid in current.received:
            return None
        return current

    def check_update(self, info: ParticipantInfo, round_number: int, num_samples: int) -> OpenRound:
        """Raise Rejected unless `info` may submit for `round_number` now."""
        with self.cond:
            current = self.current
            if current is None or current.round != round_number:
                open_round = "none" if current is None else str(current.round)
                raise Rejected(
                    Refusal.WRONG_ROUND,
                    f"update for round {round_number}, but the open round is {open_round}",
                )
            if current.closed:
                raise Rejected(Refusal.ROUND_CLOSED, f"round {round_number} is closed")
            if info.participant_id not in current.chosen:
                raise Rejected(
                    Refusal.NOT_SELECTED,
                    f"{info.participant_id} is not selected in round {round_number}",
                )
            if info.participant_id in current.received:
                raise Rejected(
                    Refusal.DUPLICATE,
                    f"{info.participant_id} already submitted for round {round_number}",
                )
            if num_samples <= 0:
                raise Rejected(Refusal.BAD_HEADER, f"num_samples must be positive, got {num_samples}")
            if num_samples != info.num_samples:
                raise Rejected(
                    Refusal.SAMPLE_COUNT_MISMATCH,
                    f"{info.participant_id} declared {info.num_samples} samples at Join, "
                    f"the update says {num_samples}",
                )
            return current

    def accept_update(
        self,
        info: ParticipantInfo,
        round_number: int,
        delta: dict[str, Tensor],
        num_samples: int,
        seconds: float,
    ) -> None:
        with self.cond:
            # Past the deadline an update still counts while the round is open (waiting for a quorum);
            # once the round is closed, check_update rejects it.
            current = self.check_update(info, round_number, num_samples)
            if not math.isfinite(seconds) or seconds < 0:
                raise Rejected(Refusal.BAD_HEADER, f"train_seconds must be finite and >= 0, got {seconds}")
            current.received[info.participant_id] = ReceivedUpdate(
                info.participant_id, delta, num_samples, train_seconds=seconds
            )
            current.refused.pop(info.participant_id, None)  # a corrected update, in time, still counts
            self.cond.notify_all()

    def refuse_update(self, info: ParticipantInfo, round_number: int, reason: str) -> None:
        """`info`'s update for the open round was refused for what it held (not finite, malformed, ...):
        once a quorum is in, the round no longer waits for another update of it (one that comes
        while the round is open still counts)."""
        with self.cond:
            current = self.current
            if current is None or current.round != round_number or current.closed:
                return
            if info.participant_id in current.chosen and info.participant_id not in current.received:
                current.refused[info.participant_id] = reason
                self.cond.notify_all()

    def wait_for_updates(
        self, opened: OpenRound, need: int, hard_deadline: float, stop: threading.Event
    ) -> bool:
        """Block until every selected participant reported (or had its update refused), or the round's
        deadline passed with `need`.

        False when `hard_deadline` passes short of `need` updates, or on `stop`.
        """
        with self.cond:
            while not stop.is_set():
                got = len(opened.received)
                now = time.time()
                if got == len(opened.selected) or (now > opened.deadline and got >= need):
                    return True
                if got + len(opened.refused) == len(opened.selected) and got >= need:  # the rest refused
                    return True
                if now > hard_deadline:
                    return False
                self.cond.wait(timeout=0.2)
        return False

    def current_round_number(self) -> int:
        with self.cond:
            return 0 if self.current is None else self.current.round
