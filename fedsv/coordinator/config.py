"""What a run trains and how it is valued (RunConfig), the same on every restart of the run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fedsv.config.checks import MAX_SEED, check_count, check_positive, require
from fedsv.data.corruptions import parse_corruption
from fedsv.data.registry import VALIDATION_FROM
from fedsv.data.shards import Holdout
from fedsv.fl.aggregation import AggregationRule
from fedsv.fl.ranks import parse_ranks
from fedsv.fl.update_bounds import POLICIES, NormBound
from fedsv.fl.update_guard import GuardSettings
from fedsv.task.interface import METRICS, LoadedTask
from fedsv.task.sources import SimulationSettings, run_task
from fedsv.valuation import ValuationSpec
from fedsv.valuation.methods import METHODS

VALUATION_METHODS = (*(m for m in METHODS if m != "random"), "none")
"""What a run may value with: any method but the random baseline (a study's reference), or none."""


UNGUARDED: dict[str, Any] = {
    "update_count_multiple": 0.0,
    "update_direction": False,
    "update_norm_history": 0,
    "update_quarantine": False,
}
"""The settings that turn the update guard (fedsv.fl.update_guard) off: FedAvg over the declared counts,
the norm bound over the round's own norms, no direction check, no quarantine (the paper's studies run so)."""


DEFAULT_TARGET_STDERR = 0.002
"""The accuracy a sampled value must reach, as a fraction of the utility's range: for accuracy, two
validation images in a thousand."""


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
    metric: str = field(
        default="accuracy",
        metadata={
            "help": "the utility of the built-in models: accuracy | neg_loss (validation log-likelihood); "
            "a --task sets its own"
        },
    )
    validation_from: str = field(
        default="train",
        metadata={
            "help": "train | test: cut the simulation's validation from the training files (the rest "
            "trains) or from the test files (every training image trains; the paper's 100 x 600)"
        },
    )
    test_size: int = field(
        default=1000,
        metadata={
            "help": "test images the simulation's accuracy is measured on (0: every one not validating)"
        },
    )
    valuation: str = field(default="auto", metadata={"help": "|".join(VALUATION_METHODS)})
    eps: float = field(default=0.05, metadata={"help": "valuation accuracy epsilon (without a budget)"})
    delta: float = field(default=0.05, metadata={"help": "valuation failure probability delta"})
    valuation_budget: int = field(
        default=0,
        metadata={"help": "distinct utility evaluations per round for sampling (0 = from eps, delta)"},
    )
    valuation_target_stderr: float = field(
        default=DEFAULT_TARGET_STDERR,
        metadata={
            "help": "where auto is not exact, sample until every value's standard error is at most this "
            "fraction of the utility's range (0 = the eps/delta budget instead)"
        },
    )
    valuation_exact_seconds: float = field(
        default=120.0,
        metadata={
            "help": "auto is exact when 2^m coalitions take at most this many seconds at the cost per "
            "coalition measured on the round's own game"
        },
    )
    valuation_max_evaluations: int = field(
        default=100_000,
        metadata={"help": "the most distinct evaluations a round's sampling to the target may use"},
    )
    valuation_budget_seconds: float = field(
        default=0.0,
        metadata={
            "help": "a time budget per round instead of the target, measured on the round's own game: auto "
            "is exact only if 2^m evaluations fit, else samples what fits (0 = none; values then do not "
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
        default="reject",
        metadata={"help": f"an update whose L2 norm is over the bound: {'|'.join(POLICIES)}"},
    )
    update_norm_bound: float = field(
        default=0.0,
        metadata={"help": "bound on an update's L2 norm (0 = --update-norm-multiple x the round's median)"},
    )
    update_norm_multiple: float = field(
        default=2.0, metadata={"help": "the adaptive bound, as a multiple of the round's median norm"}
    )
    update_count_multiple: float = field(
        default=3.0,
        metadata={
            "help": "a FedAvg weight is at most this x the federation's median declared sample count "
            "(0 = off)"
        },
    )
    update_direction: bool = field(
        default=True,
        metadata={
            "help": "turn away an update that points against the validation loss's descent and the round's "
            "other updates (further than any accepted so far) when the round's FedAvg is better without it, "
            "a null update (a free rider's), and agreeing updates against the descent in a round whose "
            "FedAvg is worse than w_t"
        },
    )
    update_norm_history: int = field(
        default=3,
        metadata={"help": "past rounds whose accepted update norms join the adaptive bound's median"},
    )
    update_quarantine: bool = field(
        default=True,
        metadata={
            "help": "quarantine a member whose updates keep making the validation loss worse (beyond its "
            "noise and the federation's spread): its updates are valued, not aggregated, until they stop"
        },
    )
    corrupt: str = field(
        default="", metadata={"help": "per-rank corruptions, e.g. '0-3=flip:0.1;7=backdoor'"}
    )
    selection: str = field(
        default="",
        metadata={"help": "fixed per-round selection instead of the seeded draw, e.g. '1=0-4;2=3,7'"},
    )

    def __post_init__(self) -> None:
        # counts within the wire's int32 fields, so no setting fails at run time after it is recorded
        for name in ("participants", "rounds", "epochs", "batch_size", "validation_size"):
            check_count(name, getattr(self, name))
        check_count("test_size", self.test_size, low=0)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        check_positive("lr", self.lr)
        require(
            self.validation_from in VALIDATION_FROM, "validation_from", "train or test", self.validation_from
        )
        require(self.metric in METRICS, "metric", " or ".join(METRICS), self.metric)
        if self.task.strip():
            require(self.metric == "accuracy", "metric", "left out with --task (the task sets its own)",
                    self.metric)  # fmt: skip
        if self.dataset == "embedded" and not self.task.strip():
            rule = "train for the embedded sample (it has no separate test files)"
            require(self.validation_from == "train", "validation_from", rule, self.validation_from)
            require(self.test_size >= 1, "test_size", "at least 1 for the embedded sample", self.test_size)
        check_count("seed", self.seed, low=0, high=MAX_SEED)
        if self.valuation not in VALUATION_METHODS:
            raise ValueError(f"valuation must be one of {list(VALUATION_METHODS)}, got {self.valuation!r}")
        if self.valuation_budget != 0 and self.valuation_budget < 2:
            raise ValueError(
                f"valuation_budget must be 0 or at least 2 evaluations, got {self.valuation_budget}"
            )
        for name in ("valuation_budget_seconds", "valuation_target_stderr"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, name, "0 or a positive number", value)
        check_positive("valuation_exact_seconds", self.valuation_exact_seconds)
        require(
            self.valuation_max_evaluations >= 2,
            "valuation_max_evaluations",
            "at least 2",
            self.valuation_max_evaluations,
        )
        self.norm_bound()  # validates the update bound
        self.guard()  # validates the weight cap, the direction check and the norms' memory
        aggregation = self.aggregation_rule()  # validates the aggregation
        if aggregation.selects:  # Krum's guarantee needs n >= 2f + 3 of the selected (Blanchard et al. 2017)
            most = (self.selected_per_round - 3) // 2
            require(
                self.aggregation_byzantine <= max(0, most),
                "aggregation_byzantine",
                f"at most {max(0, most)} with {self.selected_per_round} selected per round (n >= 2f + 3)",
                self.aggregation_byzantine,
            )
            require(
                self.aggregation_keep <= self.selected_per_round,
                "aggregation_keep",
                f"at most the {self.selected_per_round} selected per round",
                self.aggregation_keep,
            )
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
        return run_task(self.task, self.model, self.dataset, self.metric)

    def simulation(self) -> SimulationSettings:
        """What "simulated:DATASET" sources of this run need."""
        return SimulationSettings(self.data_dir, self.seed, self.holdout(), self.participants, self.partition)

    def holdout(self) -> Holdout:
        """What the simulation holds out of the data set for the coordinator."""
        return Holdout(self.validation_size, self.validation_from, self.test_size)

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

    def guard(self) -> GuardSettings:
        """How the round's updates are screened before aggregation (weights, norms' memory, direction)."""
        return GuardSettings(
            self.update_count_multiple,
            self.update_direction,
            self.update_norm_history,
            self.update_quarantine,
        )

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
            target_stderr=self.valuation_target_stderr or None,  # x the utility range, 1.0
            max_evaluations=self.valuation_max_evaluations,
            exact_seconds=self.valuation_exact_seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
