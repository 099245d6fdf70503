"""Flower's in-memory engine in one process: InMemoryGrid, LinkState and the VCE workers, no Ray."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
from flwr.server.superlink.fleet.vce.backend.backend import Backend
from flwr.server.superlink.fleet.vce.metrics import VceMetrics
from flwr.server.superlink.fleet.vce.vce_api import (
    _register_node_info_stores,
    _register_nodes,
    run_api,
)
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
from flwr.serverapp import Grid
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from fedsv.integrations.flower.traffic import object_bytes


class ThreadBackend(Backend):
    """Runs the ClientApp in the VCE's own worker thread (Ray's backend does it in an actor)."""

    def __init__(self) -> None:
        self.app_fn: Callable[[], ClientApp] | None = None

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 1  # one worker: messages run one at a time, in the order the LinkState hands them out

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        assert self.app_fn is not None
        return self.app_fn()(message=message, context=context), context


def _sizes(message: Message) -> tuple[str, int, int]:
    """(message type, serialized bytes, bytes of its content alone: metadata holds random node ids)."""
    content = 0 if message.has_error() else object_bytes(message.content)
    return message.metadata.message_type, object_bytes(message), content


@dataclass
class RecordingGrid(Grid):
    """A real Grid (InMemoryGrid) that counts every message and its serialized bytes each way."""

    inner: Grid
    sent: list[tuple[str, int, int]] = field(default_factory=list)  # (type, bytes, content bytes) out
    received: list[tuple[str, int, int]] = field(default_factory=list)  # the same of the replies

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # deprecated in flwr; delegated
        return self.inner.create_message(*args, **kwargs)

    @property
    def run(self) -> Run:
        return self.inner.run

    def set_run(self, run: Run) -> None:
        self.inner.set_run(run)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.sent += [_sizes(m) for m in messages]
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.inner.pull_messages(message_ids))
        self.received += [_sizes(m) for m in replies]
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        self.sent += [_sizes(m) for m in messages]
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        self.received += [_sizes(m) for m in replies]
        return replies


def run_federation(
    client_app: ClientApp, num_nodes: int, server: Callable[[Grid], object]
) -> tuple[object, RecordingGrid]:
    """Start num_nodes SuperNodes on Flower's in-memory LinkState, run server(grid), stop; its result."""
    state_factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    run = Run.create_empty(run_id=generate_rand_int_from_bytes(RUN_ID_NUM_BYTES))
    run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run.run_id, SUPERLINK_NODE_ID
    state = state_factory.state()
    assert isinstance(state, InMemoryLinkState)
    state.run_ids[run.run_id] = RunRecord(run=run)
    from flwr.proto.task_pb2 import Task  # flwr's own generated code

    state.task_store[run.primary_task_id] = Task(task_id=run.primary_task_id, run_id=run.run_id)
    nodes = _register_nodes(num_nodes, state_factory)
    stores = _register_node_info_stores(nodes, run)
    grid = InMemoryGrid(state_factory, pull_interval=0.01)
    grid.set_run(run)
    stop = threading.Event()
    engine = threading.Thread(
        target=run_api,
        args=(lambda: client_app, ThreadBackend, nodes, state_factory, stores, stop, VceMetrics()),
        daemon=True,
    )
    engine.start()
    recording = RecordingGrid(grid)
    try:
        result = server(recording)
    finally:
        stop.set()
        engine.join(timeout=30)
    return result, recording
