"""The processes' settings, declared once: how the coordinator serves, how a participant and a launch run."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fedsv.config.checks import INT32_MAX, INT64_MAX, MAX_SECONDS
from fedsv.settings.choices import Precision, ValuationSchedule
from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_SAMPLES, MAX_TENSOR_SET_BYTES

PROCESS_SETTINGS: dict[str, Any] = {  # name -> pydantic FieldInfo (Field's type is its default's)
    # server
    "state_dir": Field("fedsv-state", description="directory of the ledger and checkpoints"),
    "host": Field("0.0.0.0", description="address to bind gRPC and metrics to"),
    "port": Field(50051, description="gRPC port (0 = ephemeral)", ge=0, le=65535),
    "metrics_port": Field(
        9090, description="Prometheus metrics port (0 = ephemeral, -1 = off)", ge=-1, le=65535
    ),
    "health_port": Field(
        50052,
        description="plaintext port serving only the gRPC health service (0 = ephemeral, -1 = off)",
        ge=-1,
        le=65535,
    ),
    "port_file": Field("", description="write 'grpc_port metrics_port' here once serving"),
    "round_timeout": Field(
        120.0, description="seconds a round waits for updates", gt=0, le=MAX_SECONDS, allow_inf_nan=False
    ),
    "quorum": Field(0.5, description="fraction of the selected that must report", gt=0, le=1),
    "quorum_wait": Field(
        300.0, description="extra seconds to wait for a quorum", ge=0, le=MAX_SECONDS, allow_inf_nan=False
    ),
    "join_timeout": Field(
        600.0, description="seconds to wait for all participants", gt=0, le=MAX_SECONDS, allow_inf_nan=False
    ),
    "header_timeout": Field(
        10.0,
        description=(
            "seconds an update stream may take to send its header, and any other call its request (then "
            "DEADLINE_EXCEEDED)"
        ),
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    ),
    "end_grace": Field(
        10.0,
        description=(
            "after the run ends, seconds to keep serving until every participant has been told (a "
            "participant reconnecting late still reads the end and exits 0)"
        ),
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    ),
    "linger": Field(
        3.0,
        description="seconds to serve health and metrics after the run ends (-1: until SIGTERM)",
        ge=-1,
        le=MAX_SECONDS,
        allow_inf_nan=False,
    ),
    "max_chunk_bytes": Field(
        DEFAULT_CHUNK_BYTES, description="largest chunk accepted, and the model's chunk size"
    ),
    "max_update_bytes": Field(
        MAX_TENSOR_SET_BYTES, description="largest accepted update stream", ge=1, le=INT64_MAX
    ),
    "max_tensors": Field(1024, description="most tensors an update may announce", ge=1, le=INT32_MAX),
    "max_samples_per_participant": Field(
        DEFAULT_MAX_SAMPLES,
        description="largest sample count a participant may declare at Join",
        ge=1,
        le=INT64_MAX,
    ),
    "max_streams_per_participant": Field(
        2, description="concurrent Subscribe (and SubmitUpdate) calls of one participant", ge=1, le=1024
    ),
    "max_participants": Field(
        0,
        description="participants that may hold a task stream at once (0 = the world size)",
        ge=0,
        le=INT32_MAX,
    ),
    "credential": Field(
        "", description="the run's shared join credential (the coordinator's; participants present it)"
    ),
    "tls_dir": Field(
        "",
        description=(
            "TLS: directory the run's `fedsv certs` made (ca.pem, coordinator.pem/.key, and for mutual "
            "TLS the ranks' pNNN.pem/.key)"
        ),
    ),
    "tls_client_auth": Field(
        True, description="with --tls-dir: require each participant's certificate (mTLS; default on)"
    ),
    "insecure": Field(False, description="plaintext gRPC (no TLS); logs a warning"),
    "tokens_file": Field("", description="per-participant join tokens, lines 'pNNN TOKEN' (`fedsv certs`)"),
    # the coordinator's valuation process
    "valuation_schedule": Field(
        ValuationSchedule.PIPELINED,
        description="pipelined: value round t while round t+1 trains; inline: value, then go on",
    ),
    "valuation_device": Field(
        "auto", description="where round games compute: auto (CUDA when present) | cpu | cuda[:N]"
    ),
    "valuation_precision": Field(
        Precision.FP32,
        description="the games' arithmetic (tf32 and bf16 may flip accuracy utilities)",
    ),
    "valuation_backlog_bytes": Field(
        4 * 2**30,  # hundreds of rounds of the paper's models
        description="pipelined: bytes of inputs of rounds awaiting values kept on disk before rounds wait",
        ge=1,
        le=INT64_MAX,
    ),
    "valuation_threads": Field(
        0,
        description="torch threads of the idle-priority valuation process (0 = the coordinator's)",
        ge=0,
        le=4096,
    ),
    # a participant process
    "coordinator": Field("", description="coordinator address HOST:PORT (required)"),
    "rank": Field(None, description="this process's single rank (default: from mpirun or Kubernetes)"),
    "world_size": Field(None, description="number of participants N (default: from mpirun)"),
    "ranks": Field(None, description="ranks this process plays, e.g. 0-24 or 0-4,9"),
    "ranks_per_process": Field(None, description="under mpirun: ranks per process"),
    "tls_server_name": Field("", description="expect this name in the coordinator's certificate"),
    "training_threads": Field(
        0,
        description=(
            "threads that train this process's selected ranks (0 = about the cores); the ranks themselves"
            " are coroutines on one event loop"
        ),
        ge=0,
        le=4096,
    ),
    "give_up_after": Field(
        600.0, description="seconds without a coordinator", gt=0, le=MAX_SECONDS, allow_inf_nan=False
    ),
    # where processes compute, and what they read
    "data": Field(
        "",
        description=(
            "each participant's own data, a file or folder, '{rank}' filled in per rank (e.g. "
            "data/part{rank}.npz); '' = the simulated shards of --dataset"
        ),
    ),
    "device": Field(
        "",
        description=(
            "where the participants train and the coordinator values: cpu | auto (CUDA when present) | "
            "cuda[:N] ('' = participants on the CPU, values on CUDA when present)"
        ),
    ),
    "threads": Field(
        0,
        description=(
            "torch threads per process (0 = this machine's CPUs shared among the coordinator and the "
            "participant processes, at least 1; an OMP_NUM_THREADS already set wins)"
        ),
        ge=0,
        le=4096,
    ),
    "processes": Field(0, description="participant processes (0 = min(N, 4))", ge=0, le=4096),
    "out": Field("runs/latest", description="run directory (ledger, report, plot, logs)"),
}
