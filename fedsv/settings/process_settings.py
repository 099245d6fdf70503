"""The processes' settings, declared once: how the coordinator serves, how a participant and a launch run."""

from __future__ import annotations

from fedsv.config.checks import INT64_MAX
from fedsv.settings.choices import Precision, ValuationSchedule
from fedsv.settings.declaration import Count, Port, Seconds, Section, Setting, Share
from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_SAMPLES, MAX_TENSOR_SET_BYTES

S, P, L, V = Section.SERVER, Section.PARTICIPANT, Section.LAUNCH, Section.VALUATION

PROCESS_SETTINGS: dict[str, Setting] = {
    # server
    "state_dir": Setting(S, "fedsv-state", "directory of the ledger and checkpoints"),
    "host": Setting(S, "0.0.0.0", "address to bind gRPC and metrics to"),
    "port": Setting(S, 50051, "gRPC port (0 = ephemeral)", Port()),
    "metrics_port": Setting(S, 9090, "Prometheus metrics port (0 = ephemeral, -1 = off)", Port(off=True)),
    "health_port": Setting(
        S,
        50052,
        "plaintext port serving only the gRPC health service (0 = ephemeral, -1 = off)",
        Port(off=True),
    ),
    "port_file": Setting(S, "", "write 'grpc_port metrics_port' here once serving"),
    "round_timeout": Setting(S, 120.0, "seconds a round waits for updates", Seconds()),
    "quorum": Setting(S, 0.5, "fraction of the selected that must report", Share()),
    "quorum_wait": Setting(S, 300.0, "extra seconds to wait for a quorum", Seconds(zero=True)),
    "join_timeout": Setting(S, 600.0, "seconds to wait for all participants", Seconds()),
    "header_timeout": Setting(
        S,
        10.0,
        "seconds an update stream may take to send its header, and any other call its request (then "
        "DEADLINE_EXCEEDED)",
        Seconds(),
    ),
    "end_grace": Setting(
        S,
        10.0,
        "after the run ends, seconds to keep serving until every participant has been told (a participant "
        "reconnecting late still reads the end and exits 0)",
        Seconds(zero=True),
    ),
    "linger": Setting(
        S,
        3.0,
        "seconds to serve health and metrics after the run ends (-1: until SIGTERM)",
        Seconds(-1, True),
    ),
    "max_chunk_bytes": Setting(S, DEFAULT_CHUNK_BYTES, "largest chunk accepted, and the model's chunk size"),
    "max_update_bytes": Setting(
        S, MAX_TENSOR_SET_BYTES, "largest accepted update stream", Count(1, INT64_MAX)
    ),
    "max_tensors": Setting(S, 1024, "most tensors an update may announce", Count()),
    "max_samples_per_participant": Setting(
        S, DEFAULT_MAX_SAMPLES, "largest sample count a participant may declare at Join", Count(1, INT64_MAX)
    ),
    "max_streams_per_participant": Setting(
        S, 2, "concurrent Subscribe (and SubmitUpdate) calls of one participant", Count(1, 1024)
    ),
    "max_participants": Setting(
        S, 0, "participants that may hold a task stream at once (0 = the world size)", Count(0)
    ),
    "credential": Setting(
        S, "", "the run's shared join credential (the coordinator's; participants present it)"
    ),
    "tls_dir": Setting(
        S,
        "",
        "TLS: directory the run's `fedsv certs` made (ca.pem, coordinator.pem/.key, and for mutual TLS the "
        "ranks' pNNN.pem/.key)",
    ),
    "tls_client_auth": Setting(
        S, True, "with --tls-dir: require each participant's certificate (mTLS; default on)"
    ),
    "insecure": Setting(S, False, "plaintext gRPC (no TLS); logs a warning"),
    "tokens_file": Setting(S, "", "per-participant join tokens, lines 'pNNN TOKEN' (`fedsv certs`)"),
    # the coordinator's valuation process
    "valuation_schedule": Setting(
        V,
        ValuationSchedule.PIPELINED,
        "pipelined: value round t while round t+1 trains; inline: value, then go on",
        choices=ValuationSchedule,
    ),
    "valuation_device": Setting(
        V, "auto", "where round games compute: auto (CUDA when present) | cpu | cuda[:N]"
    ),
    "valuation_precision": Setting(
        V,
        Precision.FP32,
        "the games' arithmetic (tf32 and bf16 may flip accuracy utilities)",
        choices=Precision,
    ),
    "valuation_backlog_bytes": Setting(
        V,
        4 * 2**30,  # hundreds of rounds of the paper's models
        "pipelined: bytes of inputs of rounds awaiting values kept on disk before rounds wait",
        Count(1, INT64_MAX),
    ),
    "valuation_threads": Setting(
        V, 0, "torch threads of the idle-priority valuation process (0 = the coordinator's)", Count(0, 4096)
    ),
    # a participant process
    "coordinator": Setting(P, "", "coordinator address HOST:PORT (required)"),
    "rank": Setting(P, None, "this process's single rank (default: from mpirun or Kubernetes)"),
    "world_size": Setting(P, None, "number of participants N (default: from mpirun)"),
    "ranks": Setting(P, None, "ranks this process plays, e.g. 0-24 or 0-4,9"),
    "ranks_per_process": Setting(P, None, "under mpirun: ranks per process"),
    "tls_server_name": Setting(P, "", "expect this name in the coordinator's certificate"),
    "training_threads": Setting(
        P,
        0,
        "threads that train this process's selected ranks (0 = about the cores); the ranks themselves are "
        "coroutines on one event loop",
        Count(0, 4096),
    ),
    "give_up_after": Setting(P, 600.0, "seconds without a coordinator", Seconds()),
    # where processes compute, and what they read
    "data": Setting(
        L,
        "",
        "each participant's own data, a file or folder, '{rank}' filled in per rank (e.g. "
        "data/part{rank}.npz); '' = the simulated shards of --dataset",
    ),
    "device": Setting(
        L,
        "",
        "where the participants train and the coordinator values: cpu | auto (CUDA when present) | cuda[:N] "
        "('' = participants on the CPU, values on CUDA when present)",
    ),
    "threads": Setting(
        L,
        0,
        "torch threads per process (0 = this machine's CPUs shared among the coordinator and the "
        "participant processes, at least 1; an OMP_NUM_THREADS already set wins)",
        Count(0, 4096),
    ),
    "processes": Setting(L, 0, "participant processes (0 = min(N, 4))", Count(0, 4096)),
    "out": Setting(L, "runs/latest", "run directory (ledger, report, plot, logs)"),
}
