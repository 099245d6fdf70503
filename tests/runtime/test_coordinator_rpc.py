"""The coordinator's RPCs on a real gRPC server (port 0): good updates, every bad input, big models."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import torch
from prometheus_client import CollectorRegistry

from fedsv.coordinator.grpc_server import CoordinatorServers
from fedsv.coordinator.round_board import OpenRound
from fedsv.coordinator.run_end import FINISHED
from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.servicer import CoordinatorServicer
from fedsv.coordinator.update_stream import UpdateLimits
from fedsv.pipeline.metrics import RunMetrics
from fedsv.wire.call_settings import sender_metadata
from fedsv.wire.codec import TensorSetAssembler, encode_tensor_set, iter_chunks, spec_of
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc

SAMPLES = 10  # every harness participant declares this count at Join
CHUNK = 64 << 10


@dataclass
class Harness:
    state: RunState
    stub: fedsv_pb2_grpc.CoordinatorStub
    registry: CollectorRegistry
    model: dict[str, torch.Tensor]
    tokens: dict[str, str]

    def rejected(self, reason: str) -> float:
        return self.registry.get_sample_value("fedsv_updates_rejected_total", {"reason": reason}) or 0.0


def _model(big: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if big:  # 5M float32 = 20 MB, over the 16 MiB the runtime must carry both ways
        return {
            "layer.weight": torch.randn(5_000, 1_000, generator=gen),
            "layer.bias": torch.randn(1_000, generator=gen),
        }
    return {"a.weight": torch.randn(8, 4, generator=gen), "a.bias": torch.randn(8, generator=gen)}


def _start(
    model: dict[str, torch.Tensor],
    credential: str = "",
    *,
    header_timeout: float = 10.0,
    max_participants: int = 0,
) -> Generator[Harness, None, None]:
    state = RunState.new(world_size=4, credential=credential, max_participants=max_participants)
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    spec = fedsv_pb2.RunSpec(run_id="test", world_size=4, max_chunk_bytes=CHUNK)
    limits = UpdateLimits(CHUNK, 64 << 20, max_tensors=1024, header_timeout=header_timeout)
    servicer = CoordinatorServicer(state, lambda rank: spec, spec_of(model), metrics, limits)
    server = CoordinatorServers(servicer, metrics, "127.0.0.1:0", None, world_size=4)
    port = server.port
    server.start()
    channel = grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 8 << 20)]
    )
    stub = fedsv_pb2_grpc.CoordinatorStub(channel)
    tokens = {}
    for rank in range(4):
        reply = stub.Join(
            fedsv_pb2.JoinRequest(rank=rank, world_size=4, credential=credential, num_samples=SAMPLES)
        )
        tokens[reply.participant_id] = reply.session_token
    state.board.open_round(
        OpenRound(1, ["p000", "p001"], time.time() + 60, model, {f"p00{r}": r for r in range(4)})
    )
    try:
        yield Harness(state, stub, registry, model, tokens)
    finally:
        state.board.finish(FINISHED)
        channel.close()
        server.stop(grace=0)


@pytest.fixture()
def harness() -> Iterator[Harness]:
    yield from _start(_model())


def _update(
    pid: str,
    token: str,
    delta: dict[str, torch.Tensor],
    round_number: int = 1,
    *,
    corrupt_checksum: bool = False,
    drop_last_chunk: bool = False,
    huge: bool = False,
    num_samples: int = SAMPLES,
) -> list[fedsv_pb2.UpdateMessage]:
    header, payloads = encode_tensor_set(delta, chunk_bytes=CHUNK)
    if corrupt_checksum:
        header.sha256 = bytes(32)
    chunks = list(iter_chunks(header, payloads))
    if huge:  # announce a consistent 4 TiB update: refused before a byte of it is read
        first = header.tensors[0]
        del first.shape[:]
        first.shape.extend([1 << 40])
        header.total_bytes = 4 * (1 << 40) + sum(
            4 * math.prod(t.shape) for t in header.tensors if t.name != first.name
        )
        header.num_chunks = -(-header.total_bytes // CHUNK)
    if drop_last_chunk:
        chunks = chunks[:-1]
    return [
        fedsv_pb2.UpdateMessage(
            header=fedsv_pb2.UpdateHeader(
                participant_id=pid,
                session_token=token,
                round=round_number,
                num_samples=num_samples,
                delta=header,
            )
        ),
        *[fedsv_pb2.UpdateMessage(chunk=c) for c in chunks],
    ]


def _code(stub: fedsv_pb2_grpc.CoordinatorStub, messages: list[fedsv_pb2.UpdateMessage]) -> grpc.StatusCode:
    """The status of SubmitUpdate, its sender named in the metadata as the header names it."""
    header = messages[0].header
    try:
        stub.SubmitUpdate(
            iter(messages), timeout=30, metadata=sender_metadata(header.participant_id, header.session_token)
        )
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_join_gives_stable_ids_and_rejects_bad_joins(harness: Harness) -> None:
    assert sorted(harness.tokens) == ["p000", "p001", "p002", "p003"]
    reply = harness.stub.Join(fedsv_pb2.JoinRequest(rank=2, world_size=4))
    assert reply.participant_id == "p002" and reply.run.run_id == "test"
    for request, code in [
        (fedsv_pb2.JoinRequest(rank=0, world_size=5), grpc.StatusCode.FAILED_PRECONDITION),
        (fedsv_pb2.JoinRequest(rank=7, world_size=4), grpc.StatusCode.INVALID_ARGUMENT),
        (fedsv_pb2.JoinRequest(rank=-1, world_size=4), grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            harness.stub.Join(request)
        assert info.value.code() == code


def test_credential_is_required_when_configured() -> None:
    gen = _start(_model(), credential="s3cret")
    harness = next(gen)
    try:
        with pytest.raises(grpc.RpcError) as info:
            harness.stub.Join(fedsv_pb2.JoinRequest(rank=0, world_size=4, credential="wrong"))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert harness.rejected("bad_credential") == 1
    finally:
        gen.close()


def test_every_bad_update_is_rejected_with_its_code_and_the_round_goes_on(harness: Harness) -> None:
    good = {k: torch.full_like(v, 0.5) for k, v in harness.model.items()}
    t0, t1, t2 = harness.tokens["p000"], harness.tokens["p001"], harness.tokens["p002"]
    nan = {k: v.clone() for k, v in good.items()}
    nan["a.bias"][3] = float("nan")
    inf = {k: v.clone() for k, v in good.items()}
    inf["a.weight"][0, 0] = float("inf")
    cases = [
        ("unknown_participant", _update("p999", t0, good), grpc.StatusCode.UNAUTHENTICATED),
        ("bad_token", _update("p000", "forged", good), grpc.StatusCode.UNAUTHENTICATED),
        ("wrong_round", _update("p000", t0, good, round_number=2), grpc.StatusCode.FAILED_PRECONDITION),
        ("not_selected", _update("p002", t2, good), grpc.StatusCode.PERMISSION_DENIED),
        (
            "unexpected_tensors",
            _update("p000", t0, {"a.weight": good["a.weight"], "zzz": good["a.bias"]}),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "unexpected_tensors",
            _update("p000", t0, {**good, "a.bias": torch.zeros(9)}),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "unexpected_tensors",
            _update("p000", t0, {k: v.double() for k, v in good.items()}),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        ("non_finite", _update("p000", t0, nan), grpc.StatusCode.INVALID_ARGUMENT),
        ("non_finite", _update("p000", t0, inf), grpc.StatusCode.INVALID_ARGUMENT),
        ("checksum_mismatch", _update("p000", t0, good, corrupt_checksum=True), grpc.StatusCode.DATA_LOSS),
        ("incomplete", _update("p000", t0, good, drop_last_chunk=True), grpc.StatusCode.INVALID_ARGUMENT),
        ("too_large", _update("p000", t0, good, huge=True), grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("bad_header", _update("p000", t0, good, num_samples=0), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for reason, messages, code in cases:
        before = harness.rejected(reason)
        assert _code(harness.stub, messages) == code, reason
        assert harness.rejected(reason) == before + 1, reason
    assert harness.state.board.current is not None and harness.state.board.current.received == {}

    assert _code(harness.stub, _update("p000", t0, good)) == grpc.StatusCode.OK
    assert _code(harness.stub, _update("p000", t0, good)) == grpc.StatusCode.ALREADY_EXISTS
    assert harness.rejected("duplicate") == 1
    # FedAvg's weight is the count declared at Join: an update claiming another count is refused.
    assert _code(harness.stub, _update("p001", t1, good, num_samples=30)) == grpc.StatusCode.INVALID_ARGUMENT
    assert harness.rejected("sample_count_mismatch") == 1
    assert _code(harness.stub, _update("p001", t1, good)) == grpc.StatusCode.OK
    received = harness.state.board.current.received
    assert sorted(received) == ["p000", "p001"] and received["p001"].num_samples == SAMPLES
    torch.testing.assert_close(received["p000"].delta["a.weight"], good["a.weight"], rtol=0, atol=0)

    harness.state.board.close_round()
    assert _code(harness.stub, _update("p000", t0, good)) == grpc.StatusCode.FAILED_PRECONDITION
    assert harness.rejected("round_closed") == 1


def test_subscribe_streams_the_task_to_selected_participants_only(harness: Harness) -> None:
    events = harness.stub.Subscribe(
        fedsv_pb2.SubscribeRequest(participant_id="p000", session_token=harness.tokens["p000"])
    )
    first = next(events)
    assert first.WhichOneof("kind") == "task" and first.task.round == 1 and first.task.train_seed == 0
    assembler = TensorSetAssembler(first.task.model, max_total_bytes=1 << 30, max_chunk_bytes=CHUNK)
    for _ in range(first.task.model.num_chunks):
        assembler.add(next(events).chunk)
    model = assembler.finish()
    for name, value in harness.model.items():
        torch.testing.assert_close(model[name], value, rtol=0, atol=0)
    events.cancel()

    other = harness.stub.Subscribe(
        fedsv_pb2.SubscribeRequest(participant_id="p002", session_token=harness.tokens["p002"])
    )
    opened = harness.state.board.current
    assert opened is not None
    harness.state.board.close_round()  # round 2 selects p002: its waiting stream is woken with the task
    harness.state.board.open_round(OpenRound(2, ["p002"], time.time() + 60, opened.params, {"p002": 7}))
    task = next(other)
    assert task.WhichOneof("kind") == "task" and task.task.round == 2 and task.task.train_seed == 7
    for _ in range(task.task.model.num_chunks):
        assert next(other).WhichOneof("kind") == "chunk"
    harness.state.board.finish(FINISHED, rounds_completed=2)
    only = next(other)
    assert only.WhichOneof("kind") == "end" and only.end.reason == "finished"
    assert only.end.rounds_completed == 2

    with pytest.raises(grpc.RpcError) as info:
        next(
            iter(harness.stub.Subscribe(fedsv_pb2.SubscribeRequest(participant_id="p001", session_token="x")))
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_model_over_16_mib_travels_both_ways_in_chunks() -> None:
    model = _model(big=True)
    total = sum(v.numel() * v.element_size() for v in model.values())
    assert total > 16 << 20
    gen = _start(model)
    harness = next(gen)
    try:
        events = harness.stub.Subscribe(
            fedsv_pb2.SubscribeRequest(participant_id="p001", session_token=harness.tokens["p001"])
        )
        task = next(events).task
        assert task.model.num_chunks >= total // CHUNK
        assembler = TensorSetAssembler(task.model, max_total_bytes=1 << 30, max_chunk_bytes=CHUNK)
        for _ in range(task.model.num_chunks):
            assembler.add(next(events).chunk)
        down = assembler.finish()
        events.cancel()
        assert torch.equal(down["layer.weight"], model["layer.weight"])

        # A stream cancelled while the model is on its way (its generator parked at a yield) is closed.
        cut = harness.stub.Subscribe(
            fedsv_pb2.SubscribeRequest(participant_id="p001", session_token=harness.tokens["p001"])
        )
        assert next(cut).WhichOneof("kind") == "task"
        _wait(lambda: harness.state.sessions.open_calls.get(("p001", "Subscribe"), 0) == 1, "the stream")
        cut.cancel()
        _wait(
            lambda: harness.state.sessions.open_calls.get(("p001", "Subscribe"), 0) == 0,
            "the cut stream to close",
        )

        delta = {k: v * 0.001 for k, v in model.items()}
        assert _code(harness.stub, _update("p001", harness.tokens["p001"], delta)) == grpc.StatusCode.OK
        up = harness.state.board.current.received["p001"].delta  # type: ignore[union-attr]
        assert torch.equal(up["layer.weight"], delta["layer.weight"])
        assert torch.equal(up["layer.bias"], delta["layer.bias"])
    finally:
        gen.close()


def test_sample_counts_are_declared_at_join_and_bounded(harness: Harness) -> None:
    stub = harness.stub
    for count in (-1, 10_000_001):
        with pytest.raises(grpc.RpcError) as info:
            stub.Join(fedsv_pb2.JoinRequest(rank=3, world_size=4, num_samples=count))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert harness.rejected("bad_sample_count") == 2
    # 0: not known yet (a simulated shard comes from the RunSpec this Join returns): no task stream yet.
    reply = stub.Join(fedsv_pb2.JoinRequest(rank=3, world_size=4, num_samples=0))
    request = fedsv_pb2.SubscribeRequest(participant_id="p003", session_token=reply.session_token)
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Subscribe(request)))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert harness.rejected("undeclared_samples") == 1


def _open_update_calls(state: RunState) -> int:
    with state.sessions.cond:
        return sum(n for (_, rpc), n in state.sessions.open_calls.items() if rpc == "SubmitUpdate")


def _wait(condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.02)


def test_an_update_stream_that_never_sends_its_header_ends_at_the_header_deadline() -> None:
    gen = _start(_model(), header_timeout=0.5)
    harness = next(gen)
    hold = threading.Event()

    def nothing() -> Iterator[fedsv_pb2.UpdateMessage]:
        hold.wait()
        yield from ()

    try:
        metadata = sender_metadata("p000", harness.tokens["p000"])
        with pytest.raises(grpc.RpcError) as info:
            harness.stub.SubmitUpdate(nothing(), timeout=120, metadata=metadata)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert harness.rejected("header_timeout") == 1  # the server's deadline, not the client's
        _wait(lambda: _open_update_calls(harness.state) == 0, "the slot to be released")
        good = {k: torch.full_like(v, 0.5) for k, v in harness.model.items()}
        assert _code(harness.stub, _update("p000", harness.tokens["p000"], good)) == grpc.StatusCode.OK
    finally:
        hold.set()
        gen.close()


def test_an_update_must_name_its_sender_before_it_sends_anything(harness: Harness) -> None:
    hold = threading.Event()

    def nothing() -> Iterator[fedsv_pb2.UpdateMessage]:
        hold.wait()
        yield from ()

    try:
        for _ in range(5):  # refused at once: never a slot, never a read
            with pytest.raises(grpc.RpcError) as info:
                harness.stub.SubmitUpdate(nothing(), timeout=120)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert harness.rejected("no_credential") == 5 and _open_update_calls(harness.state) == 0
    finally:
        hold.set()
    good = {k: torch.full_like(v, 0.5) for k, v in harness.model.items()}
    t0, t1 = harness.tokens["p000"], harness.tokens["p001"]
    with pytest.raises(grpc.RpcError) as info:  # a header alone no longer names the sender
        harness.stub.SubmitUpdate(iter(_update("p000", t0, good)), timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert harness.rejected("no_credential") == 6
    # The metadata names one sender, the header another (or another token): PERMISSION_DENIED.
    for header_pid, header_token in (("p001", t1), ("p000", t1)):
        with pytest.raises(grpc.RpcError) as info:
            harness.stub.SubmitUpdate(
                iter(_update(header_pid, header_token, good)),
                timeout=30,
                metadata=sender_metadata("p000", t0),
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert harness.rejected("sender_mismatch") == 2
    with pytest.raises(grpc.RpcError) as info:  # a metadata token that is wrong
        harness.stub.SubmitUpdate(
            iter(_update("p000", t0, good)), timeout=30, metadata=sender_metadata("p000", "forged")
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert harness.rejected("bad_token") == 1
    assert harness.state.board.current is not None and harness.state.board.current.received == {}
    assert _code(harness.stub, _update("p000", t0, good)) == grpc.StatusCode.OK


def test_max_participants_caps_who_holds_a_task_stream() -> None:
    gen = _start(_model(), max_participants=2)
    harness = next(gen)

    def subscribe(pid: str) -> Any:
        request = fedsv_pb2.SubscribeRequest(participant_id=pid, session_token=harness.tokens[pid])
        return harness.stub.Subscribe(request)

    try:
        first, second = subscribe("p000"), subscribe("p002")
        _wait(lambda: harness.state.sessions.connected() == 2, "two task streams")
        with pytest.raises(grpc.RpcError) as info:
            next(iter(subscribe("p003")))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert harness.rejected("too_many_participants") == 1
        again = subscribe("p000")  # a participant already counted may open its second stream
        assert next(again).WhichOneof("kind") == "task"
        assert harness.state.sessions.connected() == 2
        second.cancel()  # its generator is cancelled, and with it the call: p002 no longer counts
        _wait(lambda: harness.state.sessions.connected() == 1, "p002's stream to close")
        third = subscribe("p003")
        _wait(lambda: harness.state.sessions.connected() == 2, "p003's stream")
        assert harness.rejected("too_many_participants") == 1
        for call in (first, again, third):
            call.cancel()
        _wait(lambda: harness.state.sessions.connected() == 0, "every stream to close")
    finally:
        gen.close()
