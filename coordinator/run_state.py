"""Thread-safe state of a run: who joined, the open round, and the checks every update must pass."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import Tensor

logger = logging.getLogger(__name__)


class Rejected(Exception):
    """An RPC the coordinator refuses; `reason` labels the metric, `code` names the gRPC status."""

    def __init__(self, reason: str, code: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


@dataclass
class ParticipantInfo:
    participant_id: str
    rank: int
    token: str
    host: str = ""
    streams: int = 0
    joined_at: float = field(default_factory=time.time)


@dataclass
class OpenRound:
    """The round being trained: its task payload and the updates received so far."""

    round: int
    selected: list[str]
    deadline: float
    task_header: object  # fedsv_pb2.TensorSetHeader of the global model
    task_payloads: Iterable[bytes]  # fedsv.wire.ChunkPayloads: re-iterable, shared by all streams
    train_seeds: dict[str, int]
    received: dict[str, tuple[dict[str, Tensor], int, float]] = field(default_factory=dict)
    closed: bool = False


def participant_id(rank: int) -> str:
    """The stable id of a rank."""
    return f"p{rank:03d}"


class RunState:
    """Participants, the open round and traffic counters, guarded by one condition variable."""

    def __init__(self, world_size: int, credential: str = "") -> None:
        self.world_size = world_size
        self.credential = credential
        self.cond = threading.Condition()
        self.participants: dict[str, ParticipantInfo] = {}
        self.current: OpenRound | None = None
        self.rounds_completed = 0
        self.finished = False
        self.end_reason = ""
        self.traffic: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.on_connected: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ joining
    def join(self, rank: int, world_size: int, credential: str, host: str) -> ParticipantInfo:
        if self.credential and not secrets.compare_digest(credential, self.credential):
            raise Rejected("bad_credential", "UNAUTHENTICATED", "join credential is wrong")
        if world_size != self.world_size:
            raise Rejected(
                "wrong_world_size",
                "FAILED_PRECONDITION",
                f"this run has world size {self.world_size}, the participant says {world_size}",
            )
        if not 0 <= rank < self.world_size:
            raise Rejected("bad_rank", "INVALID_ARGUMENT", f"rank {rank} outside 0..{self.world_size - 1}")
        with self.cond:
            info = ParticipantInfo(participant_id(rank), rank, secrets.token_hex(16), host)
            previous = self.participants.get(info.participant_id)
            if previous is not None:
                info.streams = previous.streams  # a rejoin (reconnect) replaces the token
            self.participants[info.participant_id] = info
            self.cond.notify_all()
        return info

    def authenticate(self, pid: str, token: str) -> ParticipantInfo:
        with self.cond:
            info = self.participants.get(pid)
        if info is None:
            raise Rejected("unknown_participant", "NOT_FOUND", f"participant {pid!r} has not joined this run")
        if not secrets.compare_digest(token, info.token):
            raise Rejected("bad_token", "UNAUTHENTICATED", f"session token of {pid} is not valid")
        return info

    def joined(self) -> int:
        with self.cond:
            return len(self.participants)

    def connected(self) -> int:
        """Participants with an open task stream: joined, prepared and listening."""
        with self.cond:
            return sum(1 for p in self.participants.values() if p.streams > 0)

    def stream_opened(self, info: ParticipantInfo, delta: int) -> None:
        with self.cond:
            info.streams += delta
            self.cond.notify_all()
        if self.on_connected is not None:
            self.on_connected(self.connected())

    # ------------------------------------------------------------------ rounds
    def open_round(self, opened: OpenRound) -> None:
        with self.cond:
            self.current = opened
            self.cond.notify_all()

    def close_round(self) -> OpenRound:
        with self.cond:
            assert self.current is not None
            self.current.closed = True
            closed = self.current
            self.cond.notify_all()
            return closed

    def finish(self, reason: str) -> None:
        with self.cond:
            self.finished = True
            self.end_reason = reason
            self.cond.notify_all()

    def task_for(self, pid: str, after_round: int) -> OpenRound | None:
        """The open round if `pid` is selected in it, has not reported, and was not sent it yet."""
        current = self.current
        if current is None or current.closed or current.round <= after_round:
            return None
        if pid not in current.selected or pid in current.received:
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
                    "FAILED_PRECONDITION",
                    f"update for round {round_number}, but the open round is {open_round}",
                )
            if current.closed:
                raise Rejected("round_closed", "FAILED_PRECONDITION", f"round {round_number} is closed")
            if info.participant_id not in current.selected:
                raise Rejected(
                    "not_selected",
                    "PERMISSION_DENIED",
                    f"{info.participant_id} is not selected in round {round_number}",
                )
            if info.participant_id in current.received:
                raise Rejected(
                    "duplicate",
                    "ALREADY_EXISTS",
                    f"{info.participant_id} already submitted for round {round_number}",
                )
            if num_samples <= 0:
                raise Rejected(
                    "bad_header", "INVALID_ARGUMENT", f"num_samples must be positive, got {num_samples}"
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
            current.received[info.participant_id] = (delta, num_samples, seconds)
            self.cond.notify_all()

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
