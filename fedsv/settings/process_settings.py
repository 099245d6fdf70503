"""The processes' settings, each declared once as an `Annotated` alias named as the setting: how the
coordinator serves, how a participant and a launch run. A config class takes one as `port: ps.port`."""

from __future__ import annotations

from typing import Annotated, TypeAlias

from pydantic import Field

from fedsv.config.checks import INT32_MAX, MAX_SECONDS
from fedsv.settings.choices import Precision, ValuationSchedule
from fedsv.settings.kinds import Bytes, Count, Fraction, Grace, OptionalPort, Port, Seconds, Threads
from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_SAMPLES, MAX_TENSOR_SET_BYTES

# server
state_dir: TypeAlias = Annotated[
    str, Field("fedsv-state", description="directory of the ledger and checkpoints")
]
host: TypeAlias = Annotated[str, Field("0.0.0.0", description="address to bind gRPC and metrics to")]
port: TypeAlias = Annotated[Port, Field(50051, description="gRPC port (0 = ephemeral)")]
metrics_port: TypeAlias = Annotated[
    OptionalPort, Field(9090, description="Prometheus metrics port (0 = ephemeral, -1 = off)")
]
health_port: TypeAlias = Annotated[
    OptionalPort,
    Field(
        50052,
        description="plaintext port serving only the gRPC health service (0 = ephemeral, -1 = off)",
    ),
]
port_file: TypeAlias = Annotated[
    str, Field("", description="write 'grpc_port metrics_port' here once serving")
]
round_timeout: TypeAlias = Annotated[Seconds, Field(120.0, description="seconds a round waits for updates")]
quorum: TypeAlias = Annotated[Fraction, Field(0.5, description="fraction of the selected that must report")]
quorum_wait: TypeAlias = Annotated[Grace, Field(300.0, description="extra seconds to wait for a quorum")]
join_timeout: TypeAlias = Annotated[Seconds, Field(600.0, description="seconds to wait for all participants")]
header_timeout: TypeAlias = Annotated[
    Seconds,
    Field(
        10.0,
        description=(
            "seconds an update stream may take to send its header, and any other call its request (then "
            "DEADLINE_EXCEEDED)"
        ),
    ),
]
end_grace: TypeAlias = Annotated[
    Grace,
    Field(
        10.0,
        description=(
            "after the run ends, seconds to keep serving until every participant has been told (a "
            "participant reconnecting late still reads the end and exits 0)"
        ),
    ),
]
linger: TypeAlias = Annotated[
    float,
    Field(
        3.0,
        description="seconds to serve health and metrics after the run ends (-1: until SIGTERM)",
        ge=-1,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    ),
]
max_chunk_bytes: TypeAlias = Annotated[
    int, Field(DEFAULT_CHUNK_BYTES, description="largest chunk accepted, and the model's chunk size")
]
max_update_bytes: TypeAlias = Annotated[
    Bytes, Field(MAX_TENSOR_SET_BYTES, description="largest accepted update stream")
]
max_tensors: TypeAlias = Annotated[Count, Field(1024, description="most tensors an update may announce")]
max_samples_per_participant: TypeAlias = Annotated[
    Bytes,
    Field(
        DEFAULT_MAX_SAMPLES,
        description="largest sample count a participant may declare at Join",
    ),
]
max_streams_per_participant: TypeAlias = Annotated[
    int,
    Field(2, description="concurrent Subscribe (and SubmitUpdate) calls of one participant", ge=1, le=1024),
]
max_participants: TypeAlias = Annotated[
    int,
    Field(
        0,
        description="participants that may hold a task stream at once (0 = the world size)",
        ge=0,
        le=INT32_MAX,
    ),
]
credential: TypeAlias = Annotated[
    str,
    Field("", description="the run's shared join credential (the coordinator's; participants present it)"),
]
tls_dir: TypeAlias = Annotated[
    str,
    Field(
        "",
        description=(
            "TLS: directory the run's `fedsv certs` made (ca.pem, coordinator.pem/.key, and for mutual "
            "TLS the ranks' pNNN.pem/.key)"
        ),
    ),
]
tls_client_auth: TypeAlias = Annotated[
    bool, Field(True, description="with --tls-dir: require each participant's certificate (mTLS; default on)")
]
insecure: TypeAlias = Annotated[bool, Field(False, description="plaintext gRPC (no TLS); logs a warning")]
tokens_file: TypeAlias = Annotated[
    str, Field("", description="per-participant join tokens, lines 'pNNN TOKEN' (`fedsv certs`)")
]

# the coordinator's valuation process
valuation_schedule: TypeAlias = Annotated[
    ValuationSchedule,
    Field(
        ValuationSchedule.PIPELINED,
        description="pipelined: value round t while round t+1 trains; inline: value, then go on",
    ),
]
valuation_device: TypeAlias = Annotated[
    str, Field("auto", description="where round games compute: auto (CUDA when present) | cpu | cuda[:N]")
]
valuation_precision: TypeAlias = Annotated[
    Precision,
    Field(
        Precision.FP32,
        description="the games' arithmetic (tf32 and bf16 may flip accuracy utilities)",
    ),
]
valuation_backlog_bytes: TypeAlias = Annotated[
    Bytes,
    Field(
        4 * 2**30,  # hundreds of rounds of the paper's models
        description="pipelined: bytes of inputs of rounds awaiting values kept on disk before rounds wait",
    ),
]
valuation_threads: TypeAlias = Annotated[
    Threads,
    Field(
        0,
        description="torch threads of the idle-priority valuation process (0 = the coordinator's)",
    ),
]

# a participant process
coordinator: TypeAlias = Annotated[str, Field("", description="coordinator address HOST:PORT (required)")]
rank: TypeAlias = Annotated[
    int | None, Field(None, description="this process's single rank (default: from mpirun or Kubernetes)")
]
world_size: TypeAlias = Annotated[
    int | None, Field(None, description="number of participants N (default: from mpirun)")
]
ranks: TypeAlias = Annotated[
    str | None, Field(None, description="ranks this process plays, e.g. 0-24 or 0-4,9")
]
ranks_per_process: TypeAlias = Annotated[
    int | None, Field(None, description="under mpirun: ranks per process")
]
tls_server_name: TypeAlias = Annotated[
    str, Field("", description="expect this name in the coordinator's certificate")
]
training_threads: TypeAlias = Annotated[
    Threads,
    Field(
        0,
        description=(
            "threads that train this process's selected ranks (0 = about the cores); the ranks themselves"
            " are coroutines on one event loop"
        ),
    ),
]
give_up_after: TypeAlias = Annotated[Seconds, Field(600.0, description="seconds without a coordinator")]

# where processes compute, and what they read
data: TypeAlias = Annotated[
    str,
    Field(
        "",
        description=(
            "each participant's own data, a file or folder, '{rank}' filled in per rank (e.g. "
            "data/part{rank}.npz); '' = the simulated shards of --dataset"
        ),
    ),
]
device: TypeAlias = Annotated[
    str,
    Field(
        "",
        description=(
            "where the participants train and the coordinator values: cpu | auto (CUDA when present) | "
            "cuda[:N] ('' = participants on the CPU, values on CUDA when present)"
        ),
    ),
]
threads: TypeAlias = Annotated[
    Threads,
    Field(
        0,
        description=(
            "torch threads per process (0 = this machine's CPUs shared among the coordinator and the "
            "participant processes, at least 1; an OMP_NUM_THREADS already set wins)"
        ),
    ),
]
processes: TypeAlias = Annotated[Threads, Field(0, description="participant processes (0 = min(N, 4))")]
out: TypeAlias = Annotated[
    str, Field("runs/latest", description="run directory (ledger, report, plot, logs)")
]
