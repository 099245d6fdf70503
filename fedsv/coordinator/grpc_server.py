"""The coordinator's gRPC servers on grpc.aio, in one event-loop thread, driven from plain threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedsv.coordinator.first_message import FirstMessageDeadline
from fedsv.coordinator.interceptors import MalformedRequests
from fedsv.coordinator.loop_thread import LoopThread
from fedsv.coordinator.servicer import CoordinatorServicer
from fedsv.pipeline.metrics import RunMetrics
from fedsv.wire.call_settings import SERVER_KEEPALIVE
from fedsv.wire.limits import GRPC_MESSAGE_BYTES
from fedsv.wire.v1 import fedsv_pb2_grpc

SERVICE_NAME = "fedsv.v1.Coordinator"
STOP_GRACE_SECONDS = 1.0  # calls in flight get this long to finish; then every call still open is cancelled

Options = Sequence[tuple[str, int | str]]
BASE_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.so_reuseport", 0),  # a second process cannot bind (and take over) our port
]
MAIN_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
    *SERVER_KEEPALIVE,
    *BASE_OPTIONS,
]


def streams_per_connection(world_size: int) -> int:
    """HTTP/2 streams one connection may hold open: every participant's task stream and update (one
    participant process may play every rank over one connection), and some room. There is no cap on
    the server's calls in all: each is a coroutine, a stalled one ends at the request deadline
    (first_message.py), and a global cap let 3N + 64 stalled calls refuse everyone else."""
    return 2 * world_size + 64


class AioServer:
    """One grpc.aio server on `loop`: made and bound at construction (its port is known at once)."""

    def __init__(
        self,
        loop: LoopThread,
        address: str,
        credentials: grpc.ServerCredentials | None,
        services: Sequence[Callable[[Any], None]],
        *,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        options: Options = BASE_OPTIONS,
    ) -> None:
        self._loop = loop

        def make() -> tuple[Any, int]:
            server = grpc.aio.server(interceptors=list(interceptors), options=list(options))
            for add in services:
                add(server)
            try:
                if credentials is None:
                    port = server.add_insecure_port(address)
                else:
                    port = server.add_secure_port(address, credentials)
            except RuntimeError as exc:
                raise ValueError(f"cannot bind gRPC to {address} (in use?)") from exc
            if port == 0:
                raise ValueError(f"cannot bind gRPC to {address}")
            return server, port

        self.server, self.port = loop.call(make)

    def start(self) -> None:
        self._loop.run(self.server.start())

    def stop(self, grace: float | None) -> None:
        """Refuse new calls, give those in flight `grace` seconds, then cancel the rest."""
        self._loop.run(self.server.stop(grace))


class CoordinatorServers:
    """The fedsv service with the health service on `address`, and (with `health_address`) the
    health service alone in plaintext for probes that cannot speak TLS; both on one event loop."""

    def __init__(
        self,
        servicer: CoordinatorServicer,
        metrics: RunMetrics,
        address: str,
        credentials: grpc.ServerCredentials | None,
        world_size: int,
        health_address: str | None = None,
        request_timeout: float = 10.0,
    ) -> None:
        self.loop = LoopThread()
        try:
            self.health = self.loop.call(health.aio.HealthServicer)

            def add_health(server: Any) -> None:
                health_pb2_grpc.add_HealthServicer_to_server(self.health, server)

            def add_coordinator(server: Any) -> None:
                fedsv_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)

            deadline = self.deadline = FirstMessageDeadline(metrics, request_timeout)
            self.main = AioServer(
                self.loop,
                address,
                credentials,
                [add_coordinator, add_health],
                # a request that never comes: DEADLINE_EXCEEDED; one that does not parse: INVALID_ARGUMENT
                interceptors=[deadline, MalformedRequests(metrics)],
                options=[*MAIN_OPTIONS, ("grpc.max_concurrent_streams", streams_per_connection(world_size))],
            )
            self.health_only = None
            if health_address is not None:
                self.health_only = AioServer(
                    self.loop,
                    health_address,
                    None,
                    [add_health],
                    interceptors=[deadline],
                    options=[*BASE_OPTIONS, ("grpc.max_concurrent_streams", 16)],
                )
        except BaseException:
            self.loop.close()
            raise
        self.port = self.main.port
        self.health_port = -1 if self.health_only is None else self.health_only.port

    def awaiting_requests(self) -> int:
        """Calls on both servers whose request has not arrived yet."""
        return self.deadline.awaiting

    def start(self) -> None:
        self.main.start()
        if self.health_only is not None:
            self.health_only.start()
        for name in ("", SERVICE_NAME):
            self.set_health(name, health_pb2.HealthCheckResponse.SERVING)

    def set_health(self, service: str, status: int) -> None:
        """What the health service answers for `service` ("" = the whole server) on both ports."""
        self.loop.run(self.health.set(service, status))

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """NOT_SERVING, then stop both servers (open calls cancelled after `grace`) and the loop;
        idempotent."""
        if self.loop.closed:
            return
        try:
            self.loop.run(self.health.enter_graceful_shutdown())  # every service NOT_SERVING, for good
            self.main.stop(grace)
            if self.health_only is not None:
                self.health_only.stop(None)
        finally:
            self.loop.close()
