"""How a rank's part in a run ended (RankResult): the coordinator's end, or why the rank stopped."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RankEnd(StrEnum):
    """The kind of a rank's end."""

    FINISHED = "finished"  # the coordinator ended the run finished
    ENDED = "ended"  # the coordinator ended the run for another reason (its detail)
    STOPPED = "stopped"  # asked to stop (a signal, or the host's stop event)
    REFUSED = "refused"  # the coordinator refused the rank (the gRPC code in the detail)
    GAVE_UP = "gave up"  # the coordinator stayed unreachable past --give-up-after
    ERROR = "error"  # the rank could not take part (its data, its task) or failed


@dataclass(frozen=True)
class RankResult:
    """A rank's end and its detail; `str()` is the line the logs show ("finished", "refused: ...")."""

    kind: RankEnd
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the rank saw its run to a finished end (the participant's exit status 0)."""
        return self.kind is RankEnd.FINISHED

    @classmethod
    def from_coordinator(cls, reason: str) -> RankResult:
        """The end the coordinator sent ("finished", or another reason: ENDED with it as the detail)."""
        if reason in ("", RankEnd.FINISHED):
            return cls(RankEnd.FINISHED)
        return cls(RankEnd.ENDED, reason)

    def __str__(self) -> str:
        if self.kind is RankEnd.ENDED:
            return self.detail
        return f"{self.kind}: {self.detail}" if self.detail else str(self.kind)


FINISHED = RankResult(RankEnd.FINISHED)
STOPPED = RankResult(RankEnd.STOPPED)
