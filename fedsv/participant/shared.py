"""What the ranks of one participant process share: grpc.aio channels, the training pool, Join slots."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field

import grpc

from fedsv.security.tls import channel_credentials
from fedsv.wire.call_settings import CLIENT_KEEPALIVE
from fedsv.wire.limits import GRPC_MESSAGE_BYTES

logger = logging.getLogger(__name__)

CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
    *CLIENT_KEEPALIVE,  # in step with the coordinator's keepalive policy (fedsv.wire.call_settings)
    # The channel's own reconnect backoff (gRPC's default grows to 120 s): while it waits, every call
    # fails at once, so a coordinator back after a restart would be found only that late. Keep it
    # within the ranks' Backoff cap.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]
JOINS_IN_FLIGHT = 32  # Joins one process has outstanding at once: a burst of ranks queues here, not there


class ChannelPool:
    """grpc.aio channels to the coordinator: one per process, shared by every rank that presents no
    certificate of its own (plaintext, or server-only TLS with tokens); under mutual TLS the
    certificate is the rank's identity, so each such rank gets its own channel (its own connection).

    Made on the event loop that uses them (grpc.aio channels belong to one loop)."""

    def __init__(self, target: str, tls_dir: str = "", server_name: str = "") -> None:
        self.target, self.tls_dir, self.server_name = target, tls_dir, server_name
        self._shared: grpc.aio.Channel | None = None
        self._own: dict[int, grpc.aio.Channel] = {}

    def channel(self, rank: int) -> grpc.aio.Channel:
        """The channel `rank` calls the coordinator on."""
        if rank in self._own:
            return self._own[rank]
        if self._shared is not None:
            return self._shared
        if not self.tls_dir:
            self._shared = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
            return self._shared
        credentials, mutual = channel_credentials(self.tls_dir, rank)
        options = list(CHANNEL_OPTIONS)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        made = grpc.aio.secure_channel(self.target, credentials, options=options)
        logger.info("rank %d: TLS to %s (%s)", rank, self.target, "mutual" if mutual else "server only")
        if mutual:
            self._own[rank] = made
        else:
            self._shared = made
        return made

    def release(self, rank: int) -> asyncio.Future[None] | None:
        """Close the rank's own channel (mutual TLS) once the rank is done; the shared one stays."""
        own = self._own.pop(rank, None)
        return asyncio.ensure_future(own.close()) if own is not None else None

    async def close(self) -> None:
        channels = [*self._own.values(), *([self._shared] if self._shared is not None else [])]
        self._own, self._shared = {}, None
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)


@dataclass
class Shared:
    """The process-wide resources each rank's coroutine is handed."""

    channels: ChannelPool
    executor: Executor  # CPU work (shard derivation, training, encoding) runs here, off the event loop
    join_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(JOINS_IN_FLIGHT))
