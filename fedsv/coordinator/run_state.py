"""What the servicer and the round loop share: sessions, the round board and the traffic counter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fedsv.coordinator.round_board import RoundBoard
from fedsv.coordinator.sessions import Sessions
from fedsv.coordinator.traffic import TrafficCounter
from fedsv.wire.limits import DEFAULT_MAX_SAMPLES


@dataclass
class RunState:
    """The three thread-safe parts of a coordinator's state, each behind its own lock."""

    sessions: Sessions
    board: RoundBoard
    traffic: TrafficCounter

    @classmethod
    def new(
        cls,
        world_size: int,
        credential: str = "",
        *,
        tokens: Mapping[str, str] | None = None,
        require_peer: bool = False,
        max_streams: int = 2,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        max_participants: int = 0,
    ) -> RunState:
        sessions = Sessions(
            world_size,
            credential,
            tokens=tokens,
            require_peer=require_peer,
            max_streams=max_streams,
            max_samples=max_samples,
            max_participants=max_participants,
        )
        return cls(sessions, RoundBoard(), TrafficCounter())
