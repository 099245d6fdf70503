"""Thread-safe state of a run: who joined, the open round, and the checks every update must pass."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from torch import Tensor

from fedsv.fl.ranks import participant_id
from fedsv.fl.updates import ClientUpdate


class Rejected(Exception):
    """An RPC the coordinator refuses; `reason` labels the metric and picks the gRPC status code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class ParticipantInfo:
    participant_id: str
    rank: int
    token: str
    host: str = ""
    num_samples: int = 0  # declared at Join (FedAvg's weight); 0 until the participant knows it
    joined_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ReceivedUpdate(ClientUpdate):
    """An update the servicer accepted: the participant's delta and count, and its own training time."""

    train_seconds: float = 0.0


@dataclass
class OpenRound:
    """The round being trained: its task payload and the updates received so far."""

    round: int
    selected: list[str]
    deadline: float
    task_header: object  # fedsv_pb2.TensorSetHeader of the global model
    task_payloads: Iterable[bytes]  # fedsv.wire.codec.ChunkPayloads: re-iterable, shared by all streams
    train_seeds: dict[str, int]
    received: dict[str, ReceivedUpdate] = field(default_factory=dict)
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


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of secrets; any string (compare_digest refuses non-ASCII str)."""
    return secrets.compare_digest(given.encode(), expected.encode())


class RunState:
    """Participants, the open round and traffic counters, guarded by one condition variable.

    Who may act as a participant: the shared `credential` (if set) on Join; the participant's own
    token from `tokens` (if given) on Join; with `require_peer` (mutual TLS) the verified certificate
    name `peer` must be the participant id on every call; the session token issued at Join on every
    later call. At most `max_streams` concurrent calls of each kind per participant, and at most
    `max_participants` (0: the world size) participants with a task stream at once.

    Task streams are woken through callbacks (`listen`): opening a round calls those of the selected
    participants only, the run's end those of everyone; nothing here runs per connected participant.
    """

    def __init__(
        self,
        world_size: int,
        credential: str = "",
        *,
        tokens: Mapping[str, str] | None = None,
        require_peer: bool = False,
        max_streams: int = 2,
        max_samples: int = 10_000_000,
        max_participants: int = 0,
    ) -> None:
        self.world_size = world_size
        self.credential = credential
        self.tokens = dict(tokens or {})
        self.require_peer = require_peer
        self.max_streams = max_streams
        self.max_samples = max_samples
        self.max_participants = max_participants or world_size
        self.open_calls: dict[tuple[str, str], int] = defaultdict(int)
        self._connected = 0  # participants with at least one open task stream
        # Each open task stream registers its own wake-up callback, called only when its participant
        # has news (a task, the run's end): waking every stream on every event would be O(N) each.
        self._listeners: dict[str, set[Callable[[], None]]] = defaultdict(set)
        self.cond = threading.Condition()
        self.participants: dict[str, ParticipantInfo] = {}
        self.current: OpenRound | None = None
        self.rounds_completed = 0
        self.finished = False
        self.end_reason = ""
        self.traffic: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.on_connected: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ joining
    def join(
        self,
        rank: int,
        world_size: int,
        credential: str,
        host: str,
        token: str = "",
        peer: str | None = None,
        num_samples: int = 0,
    ) -> ParticipantInfo:
        """Admit rank `rank` (a rejoin replaces its session) with its declared sample count.

        The count must lie in 0..max_samples; 0 means "not known yet" (a simulated shard is derived
        from the RunSpec this Join returns), and such a participant must join again with its count
        before it may subscribe."""
        if self.credential and not same_secret(credential, self.credential):
            raise Rejected("bad_credential", "join credential is wrong")
        if world_size != self.world_size:
            raise Rejected(
                "wrong_world_size",
                f"this run has world size {self.world_size}, the participant says {world_size}",
            )
        if not 0 <= rank < self.world_size:
            raise Rejected("bad_rank", f"rank {rank} outside 0..{self.world_size - 1}")
        if not 0 <= num_samples <= self.max_samples:
            raise Rejected(
                "bad_sample_count",
                f"num_samples must lie in 1..{self.max_samples} (0: not known yet), got {num_samples}",
            )
        pid = participant_id(rank)
        self.check_peer(pid, peer)
        if self.tokens:
            expected = self.tokens.get(pid)
            if expected is None or not same_secret(token, expected):
                raise Rejected("bad_participant_token", f"participant token of {pid} is wrong")
        with self.cond:
            # A rejoin (reconnect) replaces the session token: only the rank's owner gets this far.
            info = ParticipantInfo(pid, rank, secrets.token_hex(16), host, num_samples)
            self.participants[info.participant_id] = info
            self.cond.notify_all()
        return info

    def check_peer(self, pid: str, peer: str | None) -> None:
        """Raise Rejected unless the caller's certificate (if any, and it must exist under mTLS) is pid's."""
        if peer is None:
            if self.require_peer:
                raise Rejected("no_certificate", "this run requires a client certificate")
            return
        if peer != pid:
            raise Rejected("wrong_identity", f"the certificate of {peer!r} cannot act as {pid}")

    def authenticate(self, pid: str, token: str, peer: str | None = None) -> ParticipantInfo:
        self.check_peer(pid, peer)
        with self.cond:
            info = self.participants.get(pid)
        if info is None:
            raise Rejected("unknown_participant", f"participant {pid!r} has not joined this run")
        if not same_secret(token, info.token):
            raise Rejected("bad_token", f"session token of {pid} is not valid")
        return info

    def joined(self) -> int:
        with self.cond:
            return len(self.participants)

    def connected(self) -> int:
        """Participants with an open task stream: joined, prepared and listening (a counter, O(1))."""
        return self._connected

    def open_call(self, info: ParticipantInfo, rpc: str) -> None:
        """Count a call of `rpc` by the participant; RESOURCE_EXHAUSTED past max_streams at once."""
        if rpc == "Subscribe" and info.num_samples == 0:
            raise Rejected(
                "undeclared_samples", f"{info.participant_id} must declare its sample count at Join"
            )
        self.open_stream(info.participant_id, rpc)
        if rpc == "Subscribe" and self.on_connected is not None:
            self.on_connected(self.connected())

    def open_stream(self, pid: str, rpc: str) -> None:
        """Count a call of `rpc` by the identity `pid` (joined or not: a TLS certificate names it
        before the call sends anything); RESOURCE_EXHAUSTED past max_streams at once, and for a
        participant's first task stream past max_participants with one."""
        key = (pid, rpc)
        with self.cond:
            open_now = self.open_calls.get(key, 0)
            if open_now >= self.max_streams:
                raise Rejected("too_many_streams", f"{pid} already has {open_now} {rpc} calls open")
            first_task_stream = rpc == "Subscribe" and open_now == 0
            if first_task_stream and self._connected >= self.max_participants:
                raise Rejected(
                    "too_many_participants",
                    f"{self._connected} participants already hold a task stream (at most "
                    f"{self.max_participants})",
                )
            self.open_calls[key] = open_now + 1
            self._connected += first_task_stream
            self.cond.notify_all()

    def close_stream(self, pid: str, rpc: str) -> None:
        key = (pid, rpc)
        with self.cond:
            left = self.open_calls[key] - 1
            if left > 0:
                self.open_calls[key] = left
            else:  # no entry per identity that ever called: the table stays as small as what is open
                del self.open_calls[key]
                self._connected -= rpc == "Subscribe"
            self.cond.notify_all()

    def close_call(self, info: ParticipantInfo, rpc: str) -> None:
        self.close_stream(info.participant_id, rpc)
        if rpc == "Subscribe" and self.on_connected is not None:
            self.on_connected(self.connected())

    # ------------------------------------------------------------------ rounds
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

    def finish(self, reason: str, rounds_completed: int | None = None) -> None:
        with self.cond:
            self.finished = True
            self.end_reason = reason
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
                    "wrong_round",
                    f"update for round {round_number}, but the open round is {open_round}",
                )
            if current.closed:
                raise Rejected("round_closed", f"round {round_number} is closed")
            if info.participant_id not in current.chosen:
                raise Rejected(
                    "not_selected",
                    f"{info.participant_id} is not selected in round {round_number}",
                )
            if info.participant_id in current.received:
                raise Rejected(
                    "duplicate",
                    f"{info.participant_id} already submitted for round {round_number}",
                )
            if num_samples <= 0:
                raise Rejected("bad_header", f"num_samples must be positive, got {num_samples}")
            if num_samples != info.num_samples:
                raise Rejected(
                    "sample_count_mismatch",
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
                raise Rejected("bad_header", f"train_seconds must be finite and >= 0, got {seconds}")
            current.received[info.participant_id] = ReceivedUpdate(
                info.participant_id, delta, num_samples, seconds
            )
            self.cond.notify_all()

    # ------------------------------------------------------------------ waiting (the round loop)
    def wait_for_participants(self, count: int, deadline: float, stop: threading.Event) -> bool:
        """Block until `count` participants have an open task stream; False at `deadline` or on `stop`."""
        with self.cond:
            while self.connected() < count:
                if stop.is_set() or time.time() > deadline:
                    return False
                self.cond.wait(timeout=0.5)
        return True

    def wait_for_updates(
        self, opened: OpenRound, need: int, hard_deadline: float, stop: threading.Event
    ) -> bool:
        """Block until every selected participant reported, or the round's deadline passed with `need`.

        False when `hard_deadline` passes short of `need` updates, or on `stop`.
        """
        with self.cond:
            while not stop.is_set():
                got = len(opened.received)
                now = time.time()
                if got == len(opened.selected) or (now > opened.deadline and got >= need):
                    return True
                if now > hard_deadline:
                    return False
                self.cond.wait(timeout=0.2)
        return False

    # ------------------------------------------------------------------ traffic
    def count(self, round_number: int, rpc: str, direction: str, nbytes: int, messages: int = 1) -> None:
        with self.cond:
            cell = self.traffic[(round_number, rpc, direction)]
            cell[0] += nbytes
            cell[1] += messages

    def current_round_number(self) -> int:
        with self.cond:
            return 0 if self.current is None else self.current.round

    def take_traffic(self, round_number: int) -> dict[tuple[str, str], tuple[int, int]]:
        """Traffic counted for a round (and, for round r, anything counted before it under 0)."""
        with self.cond:
            keys = [k for k in self.traffic if k[0] <= round_number]
            out: dict[tuple[str, str], tuple[int, int]] = {}
            for key in keys:
                nbytes, messages = self.traffic.pop(key)
                prev = out.get((key[1], key[2]), (0, 0))
                out[(key[1], key[2])] = (prev[0] + nbytes, prev[1] + messages)
            return out
