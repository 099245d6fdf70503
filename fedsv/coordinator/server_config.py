"""Where and how the coordinator serves (ServerConfig); these may change between restarts of a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedsv.config.checks import INT64_MAX, check_count, check_port, check_seconds
from fedsv.pipeline.valuation_worker import DEFAULT_BACKLOG_BYTES
from fedsv.wire.limits import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_SAMPLES,
    MAX_CHUNK_BYTES,
    MAX_TENSOR_SET_BYTES,
    MIN_CHUNK_BYTES,
)


@dataclass(frozen=True)
class ServerConfig:
    """Where and how the coordinator serves; may change between restarts of a run."""

    state_dir: str = field(
        default="fedsv-state", metadata={"help": "directory of the ledger and checkpoints"}
    )
    host: str = field(default="0.0.0.0", metadata={"help": "address to bind gRPC and metrics to"})
    port: int = field(default=50051, metadata={"help": "gRPC port (0 = ephemeral)"})
    metrics_port: int = field(
        default=9090, metadata={"help": "Prometheus metrics port (0 = ephemeral, -1 = off)"}
    )
    port_file: str = field(default="", metadata={"help": "write 'grpc_port metrics_port' here once serving"})
    round_timeout: float = field(default=120.0, metadata={"help": "seconds a round waits for updates"})
    quorum: float = field(default=0.5, metadata={"help": "fraction of the selected that must report"})
    quorum_wait: float = field(default=300.0, metadata={"help": "extra seconds to wait for a quorum"})
    join_timeout: float = field(default=600.0, metadata={"help": "seconds to wait for all participants"})
    max_chunk_bytes: int = field(
        default=DEFAULT_CHUNK_BYTES, metadata={"help": "largest chunk accepted, and the model's chunk size"}
    )
    max_update_bytes: int = field(
        default=MAX_TENSOR_SET_BYTES, metadata={"help": "largest accepted update stream"}
    )
    credential: str = field(default="", metadata={"help": "shared join credential participants must present"})
    tls_dir: str = field(
        default="",
        metadata={"help": "TLS: directory with ca.pem and coordinator.pem/.key (made by `fedsv certs`)"},
    )
    tls_client_auth: bool = field(
        default=True,
        metadata={"help": "with --tls-dir: require each participant's certificate (mTLS; default on)"},
    )
    insecure: bool = field(default=False, metadata={"help": "serve plaintext gRPC (no TLS); logs a warning"})
    tokens_file: str = field(
        default="", metadata={"help": "per-participant join tokens, lines 'pNNN TOKEN' (`fedsv certs`)"}
    )
    health_port: int = field(
        default=50052,
        metadata={"help": "plaintext port serving only the gRPC health service (0 = ephemeral, -1 = off)"},
    )
    max_tensors: int = field(default=1024, metadata={"help": "most tensors an update may announce"})
    valuation_schedule: str = field(
        default="pipelined",
        metadata={"help": "pipelined (value round t while round t+1 trains) | inline (value, then go on)"},
    )
    valuation_device: str = field(
        default="auto",
        metadata={"help": "where round games compute: auto (CUDA when present) | cpu | cuda[:N]"},
    )
    valuation_precision: str = field(
        default="fp32", metadata={"help": "fp32 | tf32 | bf16 (tf32 and bf16 may flip accuracy utilities)"}
    )
    valuation_backlog_bytes: int = field(
        default=DEFAULT_BACKLOG_BYTES,
        metadata={
            "help": "pipelined: bytes of inputs of rounds awaiting values kept on disk before rounds wait"
        },
    )
    valuation_threads: int = field(
        default=0,
        metadata={"help": "torch threads of the idle-priority valuation process (0 = the coordinator's)"},
    )
    max_samples_per_participant: int = field(
        default=DEFAULT_MAX_SAMPLES,
        metadata={"help": "largest sample count a participant may declare at Join"},
    )
    max_streams_per_participant: int = field(
        default=2,
        metadata={"help": "concurrent Subscribe (and SubmitUpdate) calls of one participant"},
    )
    max_participants: int = field(
        default=0,
        metadata={"help": "participants that may hold a task stream at once (0 = the world size)"},
    )
    header_timeout: float = field(
        default=10.0,
        metadata={
            "help": "seconds an update stream may take to send its header, and any other call its request "
            "(then DEADLINE_EXCEEDED)"
        },
    )
    end_grace: float = field(
        default=10.0,
        metadata={
            "help": "after the run ends, seconds to keep serving until every participant has been told "
            "(a participant reconnecting late still reads the end and exits 0)"
        },
    )
    linger: float = field(
        default=3.0,
        metadata={"help": "seconds to serve health and metrics after the run ends (-1: until SIGTERM)"},
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.quorum <= 1.0:
            raise ValueError(f"quorum must be in (0, 1], got {self.quorum}")
        for name in ("round_timeout", "join_timeout", "header_timeout"):
            check_seconds(name, getattr(self, name))
        check_seconds("quorum_wait", self.quorum_wait, zero=True)
        check_seconds("end_grace", self.end_grace, zero=True)
        check_seconds("linger", self.linger, -1, zero=True)
        check_count("max_participants", self.max_participants, low=0)
        check_port("port", self.port)
        check_port("metrics_port", self.metrics_port, off=True)
        check_port("health_port", self.health_port, off=True)
        check_count("max_update_bytes", self.max_update_bytes, high=INT64_MAX)
        check_count("max_samples_per_participant", self.max_samples_per_participant, high=INT64_MAX)
        if not MIN_CHUNK_BYTES <= self.max_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(
                f"max_chunk_bytes must be between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES} "
                "(just under the 4 MiB gRPC message limit)"
            )
        check_count("max_tensors", self.max_tensors)
        check_count("max_streams_per_participant", self.max_streams_per_participant, high=1024)
        if self.valuation_schedule not in ("pipelined", "inline"):
            raise ValueError(
                f"valuation_schedule must be pipelined or inline, got {self.valuation_schedule!r}"
            )
        if self.valuation_precision not in ("fp32", "tf32", "bf16"):
            raise ValueError(
                f"valuation_precision must be fp32, tf32 or bf16, not {self.valuation_precision!r}"
            )
        check_count("valuation_backlog_bytes", self.valuation_backlog_bytes, high=INT64_MAX)
        check_count("valuation_threads", self.valuation_threads, low=0, high=4096)
        if self.tls_dir and self.insecure:
            raise ValueError("choose one of --tls-dir and --insecure, not both")
        if not self.tls_dir and not self.insecure:
            raise ValueError(
                "the coordinator needs --tls-dir DIR (TLS; create DIR with `fedsv certs`) "
                "or, for plaintext on a trusted network, --insecure"
            )
        if self.tls_dir and not self.tls_client_auth and not self.tokens_file:
            raise ValueError(
                "--no-tls-client-auth needs --tokens-file: without client certificates, per-participant "
                "tokens prove who submits"
            )
