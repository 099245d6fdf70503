"""Builds and runs a coordinator: gRPC server (with health service), metrics endpoint, round loop."""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from fedsv.config.checks import check_writable_file
from fedsv.coordinator.grpc_server import SERVICE_NAME, CoordinatorServers
from fedsv.coordinator.resume import resume
from fedsv.coordinator.round_commit import RoundCommitter
from fedsv.coordinator.round_loop import RoundLoop
from fedsv.coordinator.run_end import RunEnd
from fedsv.coordinator.run_inputs import RunInputs, RunSetup
from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.server_config import ServerConfig
from fedsv.coordinator.servicer import CoordinatorServicer
from fedsv.coordinator.update_stream import UpdateLimits
from fedsv.fl.device import resolve_device
from fedsv.fl.ranks import participant_id
from fedsv.fl.state import params_of
from fedsv.ledger import LEDGER_FILE, Ledger
from fedsv.pipeline.metrics import RunMetrics, serve_metrics, stop_metrics
from fedsv.pipeline.pending import PendingStore
from fedsv.pipeline.round_sink import RoundSink
from fedsv.pipeline.valuation_worker import ValuationWorker
from fedsv.pipeline.valuers import BackgroundValuer, InlineValuer, Valuer
from fedsv.security.certs import read_tokens
from fedsv.security.tls import server_credentials
from fedsv.settings.choices import Draw
from fedsv.settings.run import RunConfig
from fedsv.settings.run_spec import NO_CORRUPTION, to_run_spec
from fedsv.valuation.round.initial_spread import measure
from fedsv.valuation.round_valuation import GameSettings
from fedsv.wire.codec import spec_of

logger = logging.getLogger(__name__)

__all__ = ["SERVICE_NAME", "Coordinator", "run_id_of", "serve"]


def run_id_of(run: RunConfig) -> str:
    """A stable id of the run's settings: the same settings resume the same run."""
    digest = hashlib.sha256(json.dumps(run.to_dict(), sort_keys=True).encode()).hexdigest()
    return f"run-{digest[:12]}"


class Coordinator:
    """One coordinator process's parts, started and stopped together.

    The gRPC servers run on grpc.aio in one event-loop thread of their own (`CoordinatorServers`);
    the round loop runs in the thread that calls `run()`; RunState, thread-safe, is what they share.
    """

    def __init__(
        self, run: RunConfig, server: ServerConfig, registry: CollectorRegistry | None = None
    ) -> None:
        self.run_config, self.server_config = run, server
        state_dir = Path(server.state_dir)
        self.run_id = run_id_of(run)
        # Everything a setting names is checked before the ledger exists, so that no bad setting
        # leaves a run recorded: the task and its data, the valuation device, the tokens and TLS
        # files, and the ports (bound now).
        inputs = RunInputs.load(run)
        resolve_device(server.valuation_device)
        if server.port_file:
            check_writable_file("port_file", server.port_file)
        tokens = read_tokens(server.tokens_file) if server.tokens_file else None
        credentials = server_credentials(server.tls_dir, server.tls_client_auth) if server.tls_dir else None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RunMetrics(self.registry)
        self.state = RunState.new(
            run.participants,
            server.credential,
            tokens=tokens,
            require_peer=bool(server.tls_dir) and server.tls_client_auth,
            max_streams=server.max_streams_per_participant,
            max_samples=server.max_samples_per_participant,
            max_participants=server.max_participants,
        )
        self.state.sessions.on_connected = self.metrics.set_connected
        corruptions = run.corruptions()
        specs = {
            rank: to_run_spec(run, self.run_id, corruptions.get(rank, NO_CORRUPTION), server.max_chunk_bytes)
            for rank in range(run.participants)
        }
        limits = UpdateLimits(
            server.max_chunk_bytes, server.max_update_bytes, server.max_tensors, server.header_timeout
        )
        self.servicer = CoordinatorServicer(
            self.state, specs.__getitem__, spec_of(params_of(inputs.model)), self.metrics, limits
        )
        health_address = f"{server.host}:{server.health_port}" if server.health_port >= 0 else None
        self.servers = CoordinatorServers(
            self.servicer, self.metrics, f"{server.host}:{server.port}", credentials, run.participants,
            health_address, server.header_timeout,
        )  # fmt: skip
        self.port, self.health_port = self.servers.port, self.servers.health_port
        self.metrics_server: object | None = None
        self.metrics_port = -1
        try:
            self._serve_metrics()
            state_dir.mkdir(parents=True, exist_ok=True)
            self.ledger = Ledger(state_dir / LEDGER_FILE)
        except BaseException:
            self._release_ports()
            raise
        try:
            self.ledger.ensure_run(self.run_id, run.to_dict())
            if not self.ledger.initial_scores():  # measured once: a resumed run keeps its own
                validation = inputs.validation
                scores = measure(
                    inputs.task.build_model, validation.x, validation.y, inputs.task.metric, run.seed
                )
                self.ledger.record_initial_scores(scores)
            self.loop = self._round_loop(run, server, inputs, state_dir)
        except BaseException:
            self.ledger.close()
            self._release_ports()
            raise

    def _round_loop(
        self, run: RunConfig, server: ServerConfig, inputs: RunInputs, state_dir: Path
    ) -> RoundLoop:
        """The run's rounds from where the ledger left them, with the valuation worker and its backlog."""
        store = PendingStore(state_dir / "pending")
        world = [participant_id(rank) for rank in range(run.participants)]
        balanced = run.draw == Draw.BALANCED
        progress = resume(self.ledger, store, self.metrics, params_of(inputs.model), world, balanced)
        committer = RoundCommitter(
            RoundSink(self.ledger, self.metrics, progress.accounting), self.state.traffic
        )
        game = GameSettings(
            inputs.task.metric, server.valuation_device, server.valuation_precision, run.aggregation_rule()
        )
        valuer: Valuer = InlineValuer(
            inputs.model, inputs.validation, game, run.valuation_spec, progress.accounting
        )
        if server.valuation_schedule == "pipelined" and run.valuation != "none":
            worker = ValuationWorker(
                RunSetup(run),
                game,
                run.valuation_spec,
                progress.accounting,
                self.ledger,
                self.metrics,
                store,
                server.valuation_backlog_bytes,
                server.valuation_threads,
            )
            for pending in progress.backlog:
                worker.submit(pending.round)
            valuer = BackgroundValuer(worker, store)
        return RoundLoop(run, server, self.state, inputs, game, progress, committer, self.metrics, valuer)

    def _serve_metrics(self) -> None:
        """Bind the metrics port (before the ledger: a port in use is a setting's error, not a run's)."""
        config = self.server_config
        if config.metrics_port < 0:
            return
        try:
            self.metrics_server, self.metrics_port = serve_metrics(
                self.registry, config.host, config.metrics_port
            )
        except OSError as exc:
            address = f"{config.host}:{config.metrics_port}"
            raise ValueError(f"cannot serve metrics_port on {address}: {exc.strerror or exc}") from None

    def _release_ports(self) -> None:
        self.servers.stop()
        if self.metrics_server is not None:
            stop_metrics(self.metrics_server)
            self.metrics_server = None

    @property
    def transport(self) -> str:
        config = self.server_config
        if not config.tls_dir:
            return "plaintext"
        return "mutual TLS" if config.tls_client_auth else "TLS + participant tokens"

    def start(self) -> None:
        self.servers.start()
        if self.server_config.port_file:
            tmp = Path(self.server_config.port_file + ".tmp")
            tmp.write_text(f"{self.port} {self.metrics_port}\n")
            tmp.replace(self.server_config.port_file)
        if not self.server_config.tls_dir:
            logger.warning(
                "INSECURE: gRPC is plaintext (--insecure): anyone on the network can read models and "
                "deltas and act as any participant who knows the credential; use --tls-dir"
            )
        warning = self.run_config.selection_warning()
        if warning is not None:
            logger.warning("selection: %s", warning)
        logger.info(
            "coordinator %s serving gRPC on %s:%d (%s; health %d, metrics %d) for %d participants",
            self.run_id,
            socket.gethostname(),
            self.port,
            self.transport,
            self.health_port,
            self.metrics_port,
            self.run_config.participants,
        )

    def run(self) -> RunEnd:
        """Run the rounds to the end, then keep serving until every participant has read the end (at
        most `end_grace` seconds), then (health, final metrics) for `linger` seconds.

        linger < 0 serves until SIGTERM: a coordinator under a Kubernetes Deployment stays up with
        its final metrics instead of exiting into a restart loop. Participants read the end of the
        run from their task streams meanwhile and exit.
        """
        end = self.loop.run()
        world = [participant_id(rank) for rank in range(self.run_config.participants)]
        grace = time.time() + self.server_config.end_grace
        self.state.board.wait_until_told(world, grace, self.loop.stop_event)
        linger = self.server_config.linger
        deadline = float("inf") if linger < 0 else time.time() + linger
        while time.time() < deadline and not self.loop.stop_event.is_set():
            self.loop.stop_event.wait(0.1)
        return end

    def stop(self) -> None:
        """Stop the round loop, then serve NOT_SERVING, end every open call (after a grace of about a
        second, however many are open) and release the ports and the ledger; idempotent."""
        self.loop.stop_event.set()
        self.loop.valuer.close()  # the round it is valuing (if any) ends; the rest stays pending
        self._release_ports()
        self.ledger.close()


def serve(run: RunConfig, server: ServerConfig) -> int:
    """Run a coordinator until its run ends or SIGTERM/SIGINT; exit code 0 only if the run finished."""
    coordinator = Coordinator(run, server)
    try:
        coordinator.start()
    except ValueError:
        coordinator.stop()  # release the ports and the ledger before the one-line error
        raise

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("signal %d: stopping after the current step", signum)
        coordinator.loop.stop_event.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        end = coordinator.run()
    finally:
        coordinator.stop()
    logger.log(logging.INFO if end.finished else logging.WARNING, "run %s ended: %s", coordinator.run_id, end)
    return 0 if end.finished else 3
