"""How a run ends: finished, or stopped and why (typed; its text is what participants read)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class EndKind(StrEnum):
    FINISHED = "finished"
    STOPPED = "stopped"  # a signal, or the coordinator asked to stop
    NO_PARTICIPANTS = "participants did not join in time"
    NO_QUORUM = "no quorum"
    ALL_OVER_BOUND = "every update was over the norm bound"
    VALUATION_FAILED = "valuation failed"


@dataclass(frozen=True)
class RunEnd:
    """Why a run ended; `detail` says more (the round, the error)."""

    kind: EndKind
    detail: str = ""

    @property
    def finished(self) -> bool:
        return self.kind is EndKind.FINISHED

    def __str__(self) -> str:
        if self.kind in (EndKind.FINISHED, EndKind.STOPPED):
            return self.kind.value
        return f"stopped: {self.detail or self.kind.value}"


FINISHED = RunEnd(EndKind.FINISHED)
STOPPED = RunEnd(EndKind.STOPPED)
