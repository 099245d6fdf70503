"""What every RPC handler shares: counting each message's bytes, and ending a refused call with its code."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc

from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.status_codes import status_of
from fedsv.pipeline.metrics import RunMetrics
from fedsv.security.log_safety import RateLimitedLog, shown

logger = logging.getLogger(__name__)


class Calls:
    """Traffic accounting (RunState per round, Prometheus in total) and refusals of one coordinator."""

    def __init__(self, state: RunState, metrics: RunMetrics) -> None:
        self.state = state
        self.metrics = metrics
        self._log = RateLimitedLog(logger)

    def count(self, round_number: int, rpc: str, direction: str, message: Any) -> None:
        size = message.ByteSize()
        self.state.traffic.count(round_number, rpc, direction, size)
        self.metrics.record_rpc(rpc, direction, size)

    async def refuse(self, context: grpc.aio.ServicerContext, reason: str, message: str) -> NoReturn:
        """Count the refusal and end the call with the reason's status code (status_codes.py)."""
        await refuse(context, self.metrics, self._log, reason, message)


async def refuse(
    context: grpc.aio.ServicerContext,
    metrics: RunMetrics,
    log: RateLimitedLog,
    reason: str,
    message: str,
) -> NoReturn:
    """Count a refusal (`fedsv_updates_rejected_total`), log it (shortened, rate-limited) and end the
    call with the reason's status code."""
    metrics.reject(reason)
    message = shown(message)
    log.log(logging.INFO, reason, "rejected (%s): %s", reason, message)
    await context.abort(status_of(reason), message)
    raise AssertionError("unreachable")  # context.abort raises
