"""Transport security and limits on real gRPC servers: mTLS identities, tokens, RESOURCE_EXHAUSTED."""

from __future__ import annotations

import logging
import stat
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from fedsv.coordinator.__main__ import main as coordinator_main
from fedsv.coordinator.grpc_server import CoordinatorServers
from fedsv.coordinator.round_board import OpenRound
from fedsv.coordinator.run_end import FINISHED
from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.server import SERVICE_NAME, Coordinator
from fedsv.coordinator.server_config import ServerConfig
from fedsv.coordinator.servicer import CoordinatorServicer
from fedsv.coordinator.update_stream import UpdateLimits
from fedsv.participant.__main__ import main as participant_main
from fedsv.participant.host import run_alone
from fedsv.participant.worker import RankWorker
from fedsv.pipeline.metrics import RunMetrics
from fedsv.security import certs
from fedsv.security.tls import channel_credentials, server_credentials
from fedsv.settings.run import RunConfig
from fedsv.wire.call_settings import sender_metadata
from fedsv.wire.codec import encode_tensor_set, iter_chunks, spec_of
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc

CHUNK = 64 << 10
MODEL = {"a.weight": torch.ones(8, 4), "a.bias": torch.zeros(8)}


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    certs.generate(out, 4)
    return out


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("other")
    certs.generate(out, 2)
    return out


@dataclass
class Server:
    state: RunState
    port: int
    registry: CollectorRegistry

    def rejected(self, reason: str) -> float:
        return self.registry.get_sample_value("fedsv_updates_rejected_total", {"reason": reason}) or 0.0


def _serve(
    tls_dir: Path, *, client_auth: bool = True, tokens: dict[str, str] | None = None
) -> Generator[Server, None, None]:
    state = RunState.new(4, tokens=tokens, require_peer=client_auth, max_streams=2)
    registry = CollectorRegistry()
    spec = fedsv_pb2.RunSpec(run_id="test", world_size=4, max_chunk_bytes=CHUNK)
    metrics = RunMetrics(registry)
    limits = UpdateLimits(CHUNK, 64 << 20, max_tensors=4, header_timeout=10.0)
    servicer = CoordinatorServicer(state, lambda rank: spec, spec_of(MODEL), metrics, limits)
    credentials = server_credentials(tls_dir, client_auth)
    server = CoordinatorServers(servicer, metrics, "127.0.0.1:0", credentials, world_size=4)
    port = server.port
    server.start()
    state.board.open_round(OpenRound(1, ["p000", "p001"], time.time() + 60, MODEL, {"p000": 0, "p001": 1}))
    try:
        yield Server(state, port, registry)
    finally:
        state.board.finish(FINISHED)
        server.stop(grace=0)


@pytest.fixture()
def mtls(tls_dir: Path) -> Iterator[Server]:
    yield from _serve(tls_dir)


def _stub(port: int, credentials: grpc.ChannelCredentials | None) -> fedsv_pb2_grpc.CoordinatorStub:
    target = f"127.0.0.1:{port}"
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    return fedsv_pb2_grpc.CoordinatorStub(channel)


def _as(tls_dir: Path, rank: int, port: int) -> fedsv_pb2_grpc.CoordinatorStub:
    return _stub(port, channel_credentials(tls_dir, rank)[0])


def _join_code(stub: fedsv_pb2_grpc.CoordinatorStub, rank: int, token: str = "") -> grpc.StatusCode:
    try:
        stub.Join(
            fedsv_pb2.JoinRequest(rank=rank, world_size=4, num_samples=5, participant_token=token), timeout=10
        )
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _update(
    pid: str, token: str, delta: dict[str, torch.Tensor], chunk: int = CHUNK
) -> list[fedsv_pb2.UpdateMessage]:
    header, payloads = encode_tensor_set(delta, chunk_bytes=chunk)
    update = fedsv_pb2.UpdateHeader(
        participant_id=pid, session_token=token, round=1, num_samples=5, delta=header
    )
    return [
        fedsv_pb2.UpdateMessage(header=update),
        *(fedsv_pb2.UpdateMessage(chunk=c) for c in iter_chunks(header, payloads)),
    ]


def _submit(
    stub: fedsv_pb2_grpc.CoordinatorStub, messages: list[fedsv_pb2.UpdateMessage], name_sender: bool = True
) -> grpc.StatusCode:
    """The status of SubmitUpdate; with `name_sender`, the metadata names the header's sender (as a
    participant does)."""
    header = messages[0].header
    metadata = sender_metadata(header.participant_id, header.session_token) if name_sender else None
    try:
        stub.SubmitUpdate(iter(messages), timeout=10, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_certs_chain_names_and_key_permissions(tls_dir: Path) -> None:
    ca = x509.load_pem_x509_certificate((tls_dir / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((tls_dir / "coordinator.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    for rank in range(4):
        cert = x509.load_pem_x509_certificate((tls_dir / f"p{rank:03d}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"p{rank:03d}"
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [f"p{rank:03d}"]
    for secret in ["ca.key", "coordinator.key", "p000.key", "p003.key", "p001.token", "tokens.txt"]:
        assert stat.S_IMODE((tls_dir / secret).stat().st_mode) == 0o600, secret
    tokens = certs.read_tokens(tls_dir / "tokens.txt")
    assert sorted(tokens) == ["p000", "p001", "p002", "p003"] and len(set(tokens.values())) == 4
    assert (tls_dir / "p002.token").read_text().strip() == tokens["p002"]
    assert certs.complete(tls_dir, 4) and not certs.complete(tls_dir, 5)


def test_fedsv_certs_command_and_launch_make_certificates_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsv.app.cli import main as fedsv_main
    from fedsv.app.launch import Launch, LaunchConfig

    assert (
        fedsv_main(["certs", "--out", str(tmp_path / "c"), "--participants", "3", "--hosts", "h.example"])
        == 0
    )
    assert "h.example" in capsys.readouterr().out and certs.complete(tmp_path / "c", 3)
    server = x509.load_pem_x509_certificate((tmp_path / "c" / "coordinator.pem").read_bytes())
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "h.example" in sans.get_values_for_type(x509.DNSName)

    run = RunConfig(participants=3, rounds=1)
    launch = Launch(run, LaunchConfig(out=str(tmp_path / "run")))
    config, flags = launch._transport()
    ca = (tmp_path / "run" / "certs" / "ca.pem").read_bytes()
    assert config == {"tls_dir": str(tmp_path / "run" / "certs")} and flags == [
        "--tls-dir",
        config["tls_dir"],
    ]
    assert (
        launch._transport() == (config, flags) and (tmp_path / "run" / "certs" / "ca.pem").read_bytes() == ca
    )
    insecure = Launch(run, LaunchConfig(out=str(tmp_path / "plain"), insecure=True))
    assert insecure._transport() == ({"insecure": True}, ["--insecure"])


def test_mtls_participant_joins_subscribes_and_submits(mtls: Server, tls_dir: Path) -> None:
    stub = _as(tls_dir, 0, mtls.port)
    reply = stub.Join(fedsv_pb2.JoinRequest(rank=0, world_size=4, num_samples=5), timeout=10)
    events = stub.Subscribe(
        fedsv_pb2.SubscribeRequest(participant_id="p000", session_token=reply.session_token)
    )
    assert next(events).WhichOneof("kind") == "task"
    events.cancel()
    assert _submit(stub, _update("p000", reply.session_token, MODEL)) == grpc.StatusCode.OK
    assert mtls.state.board.current is not None and list(mtls.state.board.current.received) == ["p000"]


def test_callers_without_the_right_certificate_are_refused(
    mtls: Server, tls_dir: Path, other_ca: Path
) -> None:
    ca = (tls_dir / "ca.pem").read_bytes()
    no_cert = _stub(mtls.port, grpc.ssl_channel_credentials(root_certificates=ca))
    foreign = grpc.ssl_channel_credentials(
        ca, (other_ca / "p000.key").read_bytes(), (other_ca / "p000.pem").read_bytes()
    )
    assert _join_code(no_cert, 0) == grpc.StatusCode.UNAVAILABLE  # the handshake fails
    assert _join_code(_stub(mtls.port, foreign), 0) == grpc.StatusCode.UNAVAILABLE
    assert _join_code(_stub(mtls.port, None), 0) == grpc.StatusCode.UNAVAILABLE  # plaintext vs TLS
    # A participant that trusts another CA does not talk to this coordinator either.
    assert _join_code(_as(other_ca, 0, mtls.port), 0) == grpc.StatusCode.UNAVAILABLE
    assert mtls.state.sessions.joined() == 0


def test_a_participant_certificate_cannot_act_for_another_participant(mtls: Server, tls_dir: Path) -> None:
    p000, p001 = _as(tls_dir, 0, mtls.port), _as(tls_dir, 1, mtls.port)
    assert _join_code(p001, 0) == grpc.StatusCode.PERMISSION_DENIED
    token = p000.Join(fedsv_pb2.JoinRequest(rank=0, world_size=4, num_samples=5), timeout=10).session_token
    assert mtls.rejected("wrong_identity") == 1
    # p001 holds p000's session token (stolen): still refused on every call.
    assert _submit(p001, _update("p000", token, MODEL)) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:
        next(iter(p001.Subscribe(fedsv_pb2.SubscribeRequest(participant_id="p000", session_token=token))))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert mtls.rejected("wrong_identity") == 3
    # The rightful owner is unaffected, and p001 may still act as itself.
    assert _submit(p000, _update("p000", token, MODEL)) == grpc.StatusCode.OK
    own = p001.Join(fedsv_pb2.JoinRequest(rank=1, world_size=4, num_samples=5), timeout=10).session_token
    assert _submit(p001, _update("p001", own, MODEL)) == grpc.StatusCode.OK
    assert _submit(p001, _update("p001", own, MODEL)) == grpc.StatusCode.ALREADY_EXISTS


def test_without_client_certificates_per_participant_tokens_prove_the_id(tls_dir: Path) -> None:
    tokens = certs.read_tokens(tls_dir / "tokens.txt")
    gen = _serve(tls_dir, client_auth=False, tokens=tokens)
    server = next(gen)
    try:
        stub = _stub(server.port, grpc.ssl_channel_credentials((tls_dir / "ca.pem").read_bytes()))
        assert _join_code(stub, 0) == grpc.StatusCode.UNAUTHENTICATED
        assert _join_code(stub, 0, tokens["p001"]) == grpc.StatusCode.UNAUTHENTICATED
        assert server.rejected("bad_participant_token") == 2
        reply = stub.Join(
            fedsv_pb2.JoinRequest(rank=0, world_size=4, num_samples=5, participant_token=tokens["p000"])
        )
        assert _submit(stub, _update("p000", "forged", MODEL)) == grpc.StatusCode.UNAUTHENTICATED
        assert _submit(stub, _update("p000", reply.session_token, MODEL)) == grpc.StatusCode.OK
    finally:
        gen.close()


def test_limits_give_resource_exhausted_and_the_server_goes_on(mtls: Server, tls_dir: Path) -> None:
    stub = _as(tls_dir, 0, mtls.port)
    token = stub.Join(fedsv_pb2.JoinRequest(rank=0, world_size=4, num_samples=5), timeout=10).session_token
    many = {f"t{i}": torch.zeros(1) for i in range(5)}  # max_tensors=4
    assert _submit(stub, _update("p000", token, many)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert mtls.rejected("too_many_tensors") == 1
    big_chunks = _update("p000", token, MODEL, chunk=CHUNK)
    big_chunks[1].chunk.data = big_chunks[1].chunk.data * (CHUNK // len(big_chunks[1].chunk.data) + 1)
    assert _submit(stub, big_chunks) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert mtls.rejected("too_large") == 1
    request = fedsv_pb2.SubscribeRequest(participant_id="p000", session_token=token)
    streams = [stub.Subscribe(request) for _ in range(2)]
    for events in streams:
        assert next(events).WhichOneof("kind") == "task"
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Subscribe(request)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert mtls.rejected("too_many_streams") == 1
    for events in streams:
        events.cancel()
    assert _submit(stub, _update("p000", token, MODEL)) == grpc.StatusCode.OK


def _server_config(tmp_path: Path, **overrides: object) -> ServerConfig:
    settings: dict[str, object] = {
        "state_dir": str(tmp_path / "state"),
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": -1,
        "health_port": 0,
        "join_timeout": 60.0,
        "linger": 0.0,
        **overrides,
    }
    return ServerConfig(**settings)  # type: ignore[arg-type]


def test_a_tls_run_completes_and_health_is_plaintext_on_its_own_port(tmp_path: Path, tls_dir: Path) -> None:
    run = RunConfig(participants=2, fraction=1.0, rounds=1, epochs=1, validation_size=100)
    coordinator = Coordinator(
        run, _server_config(tmp_path, tls_dir=str(tls_dir)), registry=CollectorRegistry()
    )
    coordinator.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{coordinator.health_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as info:  # the health port serves nothing else
                fedsv_pb2_grpc.CoordinatorStub(channel).Join(fedsv_pb2.JoinRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        target = f"localhost:{coordinator.port}"
        workers = [RankWorker(target, r, 2, tls_dir=str(tls_dir), give_up_after=60) for r in range(2)]
        results: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda w=w: results.update({w.rank: str(run_alone(w))})) for w in workers
        ]
        for thread in threads:
            thread.start()
        assert coordinator.run().finished
        for thread in threads:
            thread.join(timeout=60)
        assert results == {0: "finished", 1: "finished"}
        assert coordinator.ledger.rounds()[0].received == ["p000", "p001"]
    finally:
        coordinator.stop()


def test_insecure_is_explicit_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = RunConfig(participants=1, rounds=1)
    caplog.set_level(logging.WARNING, logger="coordinator.server")
    coordinator = Coordinator(run, _server_config(tmp_path, insecure=True, health_port=-1))
    coordinator.start()
    coordinator.stop()
    assert any("INSECURE" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert "plaintext" in coordinator.transport
    with pytest.raises(ValueError, match="--tls-dir DIR"):
        _server_config(tmp_path)
    with pytest.raises(ValueError, match="not both"):
        _server_config(tmp_path, insecure=True, tls_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--tokens-file"):
        _server_config(tmp_path, tls_dir=str(tmp_path), tls_client_auth=False)


def test_cli_without_a_transport_choice_is_a_one_line_error(
    tmp_path: Path, tls_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert coordinator_main(["--state-dir", str(tmp_path), "--participants", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tls-dir" in err and "--insecure" in err
    assert participant_main(["--coordinator", "x:1", "--world-size", "2", "--ranks", "0-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tls-dir" in err and "--insecure" in err
    missing = ["--coordinator", "x:1", "--world-size", "2", "--ranks", "0", "--tls-dir", str(tmp_path)]
    assert participant_main(missing) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ca.pem" in err
    state = ["--state-dir", str(tmp_path / "s"), "--participants", "2", "--tls-dir", str(tmp_path)]
    assert coordinator_main(state) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "coordinator.key" in err


def _tls(argv: list[str], tls_dir: Path) -> list[str]:
    """A tests.support.runtime command line with mutual TLS instead of its --insecure."""
    return [a for a in argv if a != "--insecure"] + ["--tls-dir", str(tls_dir)]


@pytest.mark.slow
def test_a_killed_tls_coordinator_resumes_and_participants_reconnect(tmp_path: Path, tls_dir: Path) -> None:
    """SIGKILL the coordinator after round 1: restarted on the same port, it finishes rounds 2-3 with
    the same mTLS participants, each round once in the ledger."""
    from tests.support.processes import free_port, wait_for
    from tests.support.runtime import (
        coordinator_argv,
        participant_argv,
        rounds_in,
        spawn,
        stop,
        tail,
    )

    state, port = tmp_path / "state", free_port()
    state.mkdir()
    settings: dict[str, object] = {"participants": 4, "fraction": 0.5, "rounds": 3, "epochs": 1}
    settings.update(validation_size=200, valuation="exact", linger=0, metrics_port=-1)
    log = state / "coordinator.log"
    coordinator = spawn(_tls(coordinator_argv(state, settings, port), tls_dir), log)
    workers = spawn(_tls(participant_argv(f"localhost:{port}", "0-3", 4), tls_dir), tmp_path / "p.log")
    try:
        wait_for(lambda: rounds_in(state) == [1], 180, "round 1 in the ledger")
        coordinator.kill()
        coordinator.wait(timeout=30)
        coordinator = spawn(_tls(coordinator_argv(state, settings, port), tls_dir), log)
        assert coordinator.wait(timeout=240) == 0, tail(log)
        assert workers.wait(timeout=600) == 0, tail(tmp_path / "p.log")
    finally:
        stop(coordinator, workers)
    assert rounds_in(state) == [1, 2, 3]
    assert "mutual TLS" in log.read_text()


def test_header_less_streams_use_up_only_their_own_identitys_slots(mtls: Server, tls_dir: Path) -> None:
    """Under mTLS the certificate names a SubmitUpdate caller before it sends anything: an attacker
    holding p000's certificate opens streams that never send a header; past its 2 slots each is
    refused at once, and p001's honest update goes through (it was refused when limits applied only
    after the header and such streams filled the server's threads)."""
    attacker, honest = _as(tls_dir, 0, mtls.port), _as(tls_dir, 1, mtls.port)
    token = honest.Join(fedsv_pb2.JoinRequest(rank=1, world_size=4, num_samples=5), timeout=10).session_token
    hold = threading.Event()

    def nothing() -> Iterator[fedsv_pb2.UpdateMessage]:
        hold.wait()
        yield from ()

    held = [attacker.SubmitUpdate.future(nothing(), timeout=60) for _ in range(2)]
    deadline = time.time() + 60
    while mtls.state.sessions.open_calls[("p000", "SubmitUpdate")] < 2:  # both streams reached the server
        assert time.time() < deadline, "the held streams never reached the coordinator"
        time.sleep(0.05)
    refused = [attacker.SubmitUpdate.future(nothing(), timeout=60) for _ in range(20)]
    for call in refused:
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert mtls.rejected("too_many_streams") == 20
    assert _submit(honest, _update("p001", token, MODEL)) == grpc.StatusCode.OK
    hold.set()
    for call in held:
        with pytest.raises(grpc.RpcError):
            call.result(timeout=60)  # no header: INVALID_ARGUMENT once the stream ends


def test_a_participant_refused_for_capacity_sends_its_update_again(tmp_path: Path, tls_dir: Path) -> None:
    """p000's update slots are held by streams under its stolen certificate: its update is refused
    RESOURCE_EXHAUSTED, and it sends it again with backoff until the round takes it."""
    registry = CollectorRegistry()
    run = RunConfig(participants=2, fraction=1.0, rounds=1, epochs=1, validation_size=100)
    coordinator = Coordinator(run, _server_config(tmp_path, tls_dir=str(tls_dir)), registry=registry)
    coordinator.start()
    release = threading.Event()

    def nothing() -> Iterator[fedsv_pb2.UpdateMessage]:
        release.wait()
        yield from ()

    try:
        target = f"localhost:{coordinator.port}"
        thief = _stub(coordinator.port, channel_credentials(tls_dir, 0)[0])
        held = [thief.SubmitUpdate.future(nothing(), timeout=120) for _ in range(2)]
        workers = [RankWorker(target, r, 2, tls_dir=str(tls_dir), give_up_after=60) for r in range(2)]
        results: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda w=w: results.update({w.rank: str(run_alone(w))})) for w in workers
        ]
        for thread in threads:
            thread.start()
        outcome: list[str] = []
        loop = threading.Thread(target=lambda: outcome.append(str(coordinator.run())))
        loop.start()
        refused = ("fedsv_updates_rejected_total", {"reason": "too_many_streams"})
        deadline = time.time() + 120
        while not registry.get_sample_value(*refused):  # p000 tried and was refused
            assert time.time() < deadline, "p000's update was never refused"
            time.sleep(0.05)
        release.set()
        loop.join(timeout=120)
        assert outcome == ["finished"]
        for thread in threads:
            thread.join(timeout=60)
        assert results == {0: "finished", 1: "finished"}
        assert coordinator.ledger.rounds()[0].received == ["p000", "p001"]
        for call in held:
            with pytest.raises(grpc.RpcError):
                call.result(timeout=60)
    finally:
        release.set()
        coordinator.stop()


@pytest.mark.parametrize("mode", ["tokens", "insecure"])
def test_header_less_streams_with_a_stolen_session_token_hold_only_that_participants_slots(
    tmp_path: Path, tls_dir: Path, mode: str
) -> None:
    """Without client certificates the metadata's session token names a SubmitUpdate caller before it
    sends anything: 40 header-less streams under p000's stolen token hold its 2 slots (until the
    header deadline ends them) and the other 38 are refused RESOURCE_EXHAUSTED at once. The honest
    run finishes every round with both updates; p000's own update, refused while the thief held its
    slots, is sent again and taken."""
    registry = CollectorRegistry()
    tokens = certs.read_tokens(tls_dir / "tokens.txt")
    run = RunConfig(participants=2, fraction=1.0, rounds=2, epochs=1, validation_size=100)
    if mode == "tokens":  # TLS, no client certificates: per-participant tokens prove the id at Join
        transport: dict[str, object] = {"tls_dir": str(tls_dir), "tls_client_auth": False}
        transport["tokens_file"] = str(tls_dir / "tokens.txt")
        client_dir = tmp_path / "client"  # the CA only: the participants present no certificate
        client_dir.mkdir()
        (client_dir / "ca.pem").write_bytes((tls_dir / "ca.pem").read_bytes())
    else:
        transport = {"insecure": True}
    config = _server_config(tmp_path, header_timeout=3.0, **transport)
    coordinator = Coordinator(run, config, registry=registry)
    coordinator.start()
    hold = threading.Event()

    def nothing() -> Iterator[fedsv_pb2.UpdateMessage]:
        hold.wait()
        yield from ()

    try:
        if mode == "tokens":
            target = f"localhost:{coordinator.port}"
            ca = (tls_dir / "ca.pem").read_bytes()
            thief = fedsv_pb2_grpc.CoordinatorStub(
                grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
            )
            workers = [
                RankWorker(target, r, 2, tls_dir=str(client_dir), token=tokens[f"p{r:03d}"], give_up_after=60)
                for r in range(2)
            ]
        else:
            target = f"127.0.0.1:{coordinator.port}"
            thief = _stub(coordinator.port, None)
            workers = [RankWorker(target, r, 2, give_up_after=60) for r in range(2)]
        results: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda w=w: results.update({w.rank: str(run_alone(w))})) for w in workers
        ]
        for thread in threads:
            thread.start()
        deadline = time.time() + 120
        while coordinator.state.sessions.connected() < 2:
            assert time.time() < deadline, "the participants never subscribed"
            time.sleep(0.05)
        outcome: list[str] = []
        loop = threading.Thread(target=lambda: outcome.append(str(coordinator.run())))
        loop.start()
        stolen = sender_metadata("p000", coordinator.state.sessions.participants["p000"].token)
        calls = [thief.SubmitUpdate.future(nothing(), timeout=120, metadata=stolen) for _ in range(40)]
        codes: dict[grpc.StatusCode, int] = {}
        for call in calls:
            with pytest.raises(grpc.RpcError) as info:
                call.result(timeout=120)
            codes[info.value.code()] = codes.get(info.value.code(), 0) + 1
        assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED: 38, grpc.StatusCode.DEADLINE_EXCEEDED: 2}
        loop.join(timeout=240)
        assert outcome == ["finished"]
        for thread in threads:
            thread.join(timeout=60)
        assert results == {0: "finished", 1: "finished"}
        assert [r.received for r in coordinator.ledger.rounds()] == [["p000", "p001"], ["p000", "p001"]]
        rejected = ("fedsv_updates_rejected_total", {"reason": "too_many_streams"})
        assert (registry.get_sample_value(*rejected) or 0) >= 38
        timed_out = ("fedsv_updates_rejected_total", {"reason": "header_timeout"})
        assert registry.get_sample_value(*timed_out) == 2
    finally:
        hold.set()
        coordinator.stop()
