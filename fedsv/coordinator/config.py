"""The run's settings (shared by `fedsv launch` and `python -m fedsv.coordinator`), as dataclasses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fedsv.data.corruptions import parse_corruption
from fedsv.fl.aggregation import AggregationRule
from fedsv.fl.ranks import parse_ranks
from fedsv.fl.update_bounds import POLICIES, NormBound
from fedsv.task.interface import LoadedTask
from fedsv.task.sources import SimulationSettings, run_task
from fedsv.valuation import ValuationSpec
from fedsv.valuation.methods import METHODS
from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, MAX_TENSOR_SET_BYTES, MIN_CHUNK_BYTES

VALUATION_METHODS = (*(m for m in METHODS if m != "random"), "none")
"""What a run may value with: any method but the random baseline (a study's reference), or none."""


def require(ok: bool, name: str, rule: str, value: object) -> None:
    """ValueError "NAME must be RULE, got VALUE" (one line naming the setting) unless `ok`."""
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def check_port(name: str, value: int, off: bool = False) -> None:
    """A TCP port 0..65535 (0: ephemeral), or -1 (off) where `off` is allowed."""
    low = -1 if off else 0
    require(low <= value <= 65535, name, f"a port in {low}..65535", value)


def check_positive(name: str, value: float) -> None:
    require(math.isfinite(value) and value > 0, name, "a positive finite number", value)


DEFAULT_BUDGET_SECONDS = 0.25
"""Valuation time per round: below a participant's local training time at the demo's settings
(about 0.2-0.3 s on 2 cores), so that valuation does not set the federation's pace."""


@dataclass(frozen=True)
class RunConfig:
    """What a run trains and how it is valued; identical on every restart of the run."""

    participants: int = field(default=20, metadata={"help": "number of participants N (world size)"})
    fraction: float = field(default=0.5, metadata={"help": "fraction C of participants selected per round"})
    rounds: int = field(default=5, metadata={"help": "training rounds T"})
    seed: int = field(default=0, metadata={"help": "seed of split, partition, selection and training"})
    task: str = field(
        default="",
        metadata={"help": "MODULE:ATTR or FILE.py:ATTR of the task ('' = the paper's --model on --dataset)"},
    )
    validation_data: str = field(
        default="",
        metadata={"help": "the coordinator's validation data ('' = the --dataset simulation's split)"},
    )
    test_data: str = field(
        default="",
        metadata={"help": "test data for reported accuracy ('' = the simulation's, none with --task)"},
    )
    dataset: str = field(default="embedded", metadata={"help": "embedded | mnist | fashion_mnist | cifar10"})
    data_dir: str = field(default="", metadata={"help": "directory holding the dataset files"})
    partition: str = field(default="iid", metadata={"help": "iid | noniid"})
    model: str = field(default="mlp", metadata={"help": "mlp | cnn"})
    epochs: int = field(default=5, metadata={"help": "local epochs"})
    batch_size: int = field(default=10, metadata={"help": "local batch size"})
    lr: float = field(default=0.05, metadata={"help": "local learning rate"})
    validation_size: int = field(default=1000, metadata={"help": "validation samples for the utility"})
    valuation: str = field(default="auto", metadata={"help": "|".join(VALUATION_METHODS)})
    eps: float = field(default=0.05, metadata={"help": "valuation accuracy epsilon (without a budget)"})
    delta: float = field(default=0.05, metadata={"help": "valuation failure probability delta"})
    valuation_budget: int = field(
        default=0,
        metadata={"help": "distinct utility evaluations per round for sampling (0 = from eps, delta)"},
    )
    valuation_budget_seconds: float = field(
        default=DEFAULT_BUDGET_SECONDS,
        metadata={
            "help": "valuation time per round, measured on the round's own game: auto is exact only if "
            "2^m evaluations fit, else samples what fits (0 = no time budget; values then do not "
            "depend on the machine)"
        },
    )
    aggregation: str = field(
        default="fedavg",
        metadata={"help": "fedavg | uniform | median | trimmed_mean | krum | multi_krum (robust rules)"},
    )
    aggregation_trim: float = field(
        default=0.1, metadata={"help": "trimmed_mean: fraction of values cut at each end"}
    )
    aggregation_byzantine: int = field(
        default=1, metadata={"help": "krum, multi_krum: participants assumed malicious (f)"}
    )
    aggregation_keep: int = field(
        default=0, metadata={"help": "multi_krum: updates averaged (0 = selected - f)"}
    )
    update_norm_policy: str = field(
        default="clip",
        metadata={"help": f"an update whose L2 norm is over the bound: {'|'.join(POLICIES)}"},
    )
    update_norm_bound: float = field(
        default=0.0,
        metadata={"help": "bound on an update's L2 norm (0 = --update-norm-multiple x the round's median)"},
    )
    update_norm_multiple: float = field(
        default=2.0, metadata={"help": "the adaptive bound, as a multiple of the round's median norm"}
    )
    corrupt: str = field(
        default="", metadata={"help": "per-rank corruptions, e.g. '0-3=flip:0.1;7=backdoor'"}
    )
    selection: str = field(
        default="",
        metadata={"help": "fixed per-round selection instead of the seeded draw, e.g. '1=0-4;2=3,7'"},
    )

    def __post_init__(self) -> None:
        if self.participants < 1:
            raise ValueError(f"participants must be at least 1, got {self.participants}")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")
        require(self.epochs >= 1, "epochs", "at least 1", self.epochs)
        require(self.batch_size >= 1, "batch_size", "at least 1", self.batch_size)
        check_positive("lr", self.lr)
        require(self.validation_size >= 1, "validation_size", "at least 1", self.validation_size)
        require(self.seed >= 0, "seed", "a non-negative integer", self.seed)
        if self.valuation not in VALUATION_METHODS:
            raise ValueError(f"valuation must be one of {list(VALUATION_METHODS)}, got {self.valuation!r}")
        if self.valuation_budget != 0 and self.valuation_budget < 2:
            raise ValueError(
                f"valuation_budget must be 0 or at least 2 evaluations, got {self.valuation_budget}"
            )
        seconds = self.valuation_budget_seconds
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"valuation_budget_seconds must be 0 or a positive number, got {seconds}")
        self.norm_bound()  # validates the update bound
        self.aggregation_rule()  # validates the aggregation
        self.valuation_spec(1)  # validates eps, delta and the budgets now, not in round 1
        self.corruptions()  # validates the spec
        self.schedule()  # validates the selection
        if self.task.strip() and not self.validation_data.strip():
            raise ValueError(
                "task needs validation_data (--validation-data PATH: the coordinator's validation set)"
            )

    @property
    def selected_per_round(self) -> int:
        return max(1, round(self.fraction * self.participants))

    def corruptions(self) -> dict[int, str]:
        """rank -> corruption spec, from `corrupt` ("RANKS=SPEC;RANKS=SPEC")."""
        out: dict[int, str] = {}
        for part in filter(None, (p.strip() for p in self.corrupt.split(";"))):
            ranks, sep, spec = part.partition("=")
            if not sep:
                raise ValueError(f"corrupt entry {part!r} must look like RANKS=SPEC, e.g. 0-3=flip:0.1")
            parse_corruption(spec)
            for rank in parse_ranks(ranks, self.participants):
                out[rank] = spec
        return out

    def schedule(self) -> dict[int, tuple[int, ...]]:
        """round -> selected ranks, from `selection` ("ROUND=RANKS;..."); empty for the seeded draw.

        A fixed selection must name every round: replaying a run's selection while dismissing some of
        each round's participants (data summarization) is what it is for.
        """
        out: dict[int, tuple[int, ...]] = {}
        for part in filter(None, (p.strip() for p in self.selection.split(";"))):
            number, sep, ranks = part.partition("=")
            if not sep or not number.strip().isdigit():
                raise ValueError(f"selection entry {part!r} must look like ROUND=RANKS, e.g. 1=0-4,7")
            round_number = int(number)
            if not 1 <= round_number <= self.rounds:
                raise ValueError(f"selection names round {round_number}; the run has rounds 1..{self.rounds}")
            if round_number in out:
                raise ValueError(f"selection names round {round_number} twice")
            out[round_number] = parse_ranks(ranks, self.participants)
        if out and len(out) != self.rounds:
            missing = sorted(set(range(1, self.rounds + 1)) - set(out))
            raise ValueError(f"selection must name every round; missing {missing}")
        return out

    def load_task(self) -> LoadedTask:
        """The run's task (imported now): --task, or the paper's --model sized for --dataset."""
        return run_task(self.task, self.model, self.dataset)

    def simulation(self) -> SimulationSettings:
        """What "simulated:DATASET" sources of this run need."""
        return SimulationSettings(
            self.data_dir, self.seed, self.validation_size, self.participants, self.partition
        )

    @property
    def validation_source(self) -> str:
        return self.validation_data.strip() or f"simulated:{self.dataset}"

    @property
    def test_source(self) -> str:
        """Where test accuracy is measured; "" (no test set) for a --task run without --test-data."""
        if self.test_data.strip():
            return self.test_data.strip()
        return "" if self.task.strip() else f"simulated:{self.dataset}"

    def aggregation_rule(self) -> AggregationRule:
        """The rule that aggregates each round, and values every coalition of its game."""
        return AggregationRule(
            self.aggregation, self.aggregation_trim, self.aggregation_byzantine, self.aggregation_keep
        )

    def norm_bound(self) -> NormBound:
        """How the round's updates are bounded before aggregation and valuation."""
        return NormBound(self.update_norm_policy, self.update_norm_bound, self.update_norm_multiple)

    def valuation_spec(self, round_number: int) -> ValuationSpec | None:
        """How round `round_number` is valued (seeded per round); None when valuation is off."""
        if self.valuation == "none":
            return None
        return ValuationSpec(
            method=self.valuation,
            eps=self.eps,
            delta=self.delta,
            seed=self.seed + round_number,
            budget=self.valuation_budget or None,
            budget_seconds=self.valuation_budget_seconds or None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    valuation_queue: int = field(
        default=2, metadata={"help": "pipelined: rounds that may wait for their values before rounds wait"}
    )
    max_samples_per_participant: int = field(
        default=10_000_000, metadata={"help": "largest sample count a participant may declare at Join"}
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
        metadata={"help": "seconds an update stream may take to send its header (then DEADLINE_EXCEEDED)"},
    )
    linger: float = field(
        default=3.0,
        metadata={"help": "seconds to serve health and metrics after the run ends (-1: until SIGTERM)"},
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.quorum <= 1.0:
            raise ValueError(f"quorum must be in (0, 1], got {self.quorum}")
        check_positive("round_timeout", self.round_timeout)
        check_positive("join_timeout", self.join_timeout)
        check_positive("header_timeout", self.header_timeout)
        require(self.max_participants >= 0, "max_participants", "0 or more", self.max_participants)
        require(
            math.isfinite(self.quorum_wait) and self.quorum_wait >= 0, "quorum_wait", ">= 0", self.quorum_wait
        )
        require(math.isfinite(self.linger) and self.linger >= -1, "linger", "-1 or more seconds", self.linger)
        check_port("port", self.port)
        check_port("metrics_port", self.metrics_port, off=True)
        check_port("health_port", self.health_port, off=True)
        require(self.max_update_bytes >= 1, "max_update_bytes", "at least 1", self.max_update_bytes)
        require(
            self.max_samples_per_participant >= 1,
            "max_samples_per_participant",
            "at least 1",
            self.max_samples_per_participant,
        )
        if not MIN_CHUNK_BYTES <= self.max_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(
                f"max_chunk_bytes must be between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES} "
                "(just under the 4 MiB gRPC message limit)"
            )
        if self.max_tensors < 1 or self.max_streams_per_participant < 1:
            raise ValueError("max_tensors and max_streams_per_participant must be at least 1")
        if self.valuation_schedule not in ("pipelined", "inline"):
            raise ValueError(
                f"valuation_schedule must be pipelined or inline, got {self.valuation_schedule!r}"
            )
        if self.valuation_precision not in ("fp32", "tf32", "bf16"):
            raise ValueError(
                f"valuation_precision must be fp32, tf32 or bf16, not {self.valuation_precision!r}"
            )
        if self.valuation_queue < 1:
            raise ValueError(f"valuation_queue must be at least 1, got {self.valuation_queue}")
        if self.max_samples_per_participant < 1:
            raise ValueError(
                f"max_samples_per_participant must be at least 1, got {self.max_samples_per_participant}"
            )
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
