"""Sessions: who may act as a participant (Join, authentication) and how many calls each may hold open."""

from __future__ import annotations

import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fedsv.coordinator.refusals import Refusal
from fedsv.fl.ranks import participant_id
from fedsv.wire.limits import DEFAULT_MAX_SAMPLES


class Rejected(Exception):
    """An RPC the coordinator refuses; `reason` labels the metric and picks the gRPC status code."""

    def __init__(self, reason: Refusal, message: str) -> None:
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


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of secrets; any string (compare_digest refuses non-ASCII str)."""
    return secrets.compare_digest(given.encode(), expected.encode())


class Sessions:
    """Participants' sessions and the calls they hold, guarded by one condition variable.

    Who may act as a participant: the shared `credential` (if set) on Join; the participant's own
    token from `tokens` (if given) on Join; with `require_peer` (mutual TLS) the verified certificate
    name `peer` must be the participant id on every call; the session token issued at Join on every
    later call. At most `max_streams` concurrent calls of each kind per participant, and at most
    `max_participants` (0: the world size) participants with a task stream at once.
    """

    def __init__(
        self,
        world_size: int,
        credential: str = "",
        *,
        tokens: Mapping[str, str] | None = None,
        require_peer: bool = False,
        max_streams: int = 2,
        max_samples: int = DEFAULT_MAX_SAMPLES,
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
        self.cond = threading.Condition()
        self.participants: dict[str, ParticipantInfo] = {}
        self.on_connected: Callable[[int], None] | None = None

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
            raise Rejected(Refusal.BAD_CREDENTIAL, "join credential is wrong")
        if world_size != self.world_size:
            raise Rejected(
                Refusal.WRONG_WORLD_SIZE,
                f"this run has world size {self.world_size}, the participant says {world_size}",
            )
        if not 0 <= rank < self.world_size:
            raise Rejected(Refusal.BAD_RANK, f"rank {rank} outside 0..{self.world_size - 1}")
        if not 0 <= num_samples <= self.max_samples:
            raise Rejected(
                Refusal.BAD_SAMPLE_COUNT,
                f"num_samples must lie in 1..{self.max_samples} (0: not known yet), got {num_samples}",
            )
        pid = participant_id(rank)
        self.check_peer(pid, peer)
        if self.tokens:
            expected = self.tokens.get(pid)
            if expected is None or not same_secret(token, expected):
                raise Rejected(Refusal.BAD_PARTICIPANT_TOKEN, f"participant token of {pid} is wrong")
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
                raise Rejected(Refusal.NO_CERTIFICATE, "this run requires a client certificate")
            return
        if peer != pid:
            raise Rejected(Refusal.WRONG_IDENTITY, f"the certificate of {peer!r} cannot act as {pid}")

    def authenticate(self, pid: str, token: str, peer: str | None = None) -> ParticipantInfo:
        """The session `token` names; an unknown participant and a wrong token get the same answer
        (UNAUTHENTICATED, one message), so a stranger cannot learn which ids have joined."""
        self.check_peer(pid, peer)
        info = self._session(pid, token)
        if info is None:
            reason = Refusal.BAD_TOKEN if pid in self.participants else Refusal.UNKNOWN_PARTICIPANT
            raise Rejected(reason, f"no valid session for {pid!r}: join (again)")
        return info

    def is_current(self, pid: str, token: str) -> bool:
        """True while `token` is `pid`'s session (no later Join replaced it)."""
        return self._session(pid, token) is not None

    def _session(self, pid: str, token: str) -> ParticipantInfo | None:
        """`pid`'s session if `token` is its token, else None."""
        with self.cond:
            info = self.participants.get(pid)
        return info if info is not None and same_secret(token, info.token) else None

    def declared_counts(self) -> list[int]:
        """The sample counts the joined participants declared (those that declared one)."""
        with self.cond:
            return [info.num_samples for info in self.participants.values() if info.num_samples > 0]

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
                Refusal.UNDECLARED_SAMPLES, f"{info.participant_id} must declare its sample count at Join"
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
                raise Rejected(Refusal.TOO_MANY_STREAMS, f"{pid} already has {open_now} {rpc} calls open")
            first_task_stream = rpc == "Subscribe" and open_now == 0
            if first_task_stream and self._connected >= self.max_participants:
                raise Rejected(
                    Refusal.TOO_MANY_PARTICIPANTS,
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

    def wait_for_participants(self, count: int, deadline: float, stop: threading.Event) -> bool:
        """Block until `count` participants have an open task stream; False at `deadline` or on `stop`."""
        with self.cond:
            while self.connected() < count:
                if stop.is_set() or time.time() > deadline:
                    return False
                self.cond.wait(timeout=0.5)
        return True
