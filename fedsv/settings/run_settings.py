"""The run's settings, each declared once (type, default, range, help) as an `Annotated` alias named as the
setting: data, training, aggregation, guard, valuation. A config class takes one as `rounds: rs.rounds`."""

from __future__ import annotations

from typing import Annotated, TypeAlias

from pydantic import Field

from fedsv.config.checks import INT32_MAX, MAX_SEED
from fedsv.settings.choices import (
    Aggregation,
    Dataset,
    Draw,
    Metric,
    ModelName,
    NormPolicy,
    Partition,
    ValidationFrom,
    ValuationMethod,
)
from fedsv.settings.kinds import Count, Fraction, NonNegative, Positive

# the library's own fallback is valuation.target.FALLBACK_STDERR: a participant loads this module and
# must not load the valuation layer, so the run declares its default here
DEFAULT_TARGET_STDERR = 0.002
"""The accuracy a sampled value must reach, as a fraction of the utility's range: for accuracy, two
validation images in a thousand."""


# data
participants: TypeAlias = Annotated[Count, Field(20, description="number of participants N (world size)")]
seed: TypeAlias = Annotated[
    int, Field(0, description="seed of split, partition, selection and training", ge=0, le=MAX_SEED)
]
task: TypeAlias = Annotated[
    str,
    Field(
        "", description="the run's task, MODULE:ATTR or FILE.py:ATTR ('' = the paper's --model on --dataset)"
    ),
]
validation_data: TypeAlias = Annotated[
    str, Field("", description="the coordinator's validation data ('' = the --dataset simulation's split)")
]
test_data: TypeAlias = Annotated[
    str, Field("", description="test data for reported accuracy ('' = the simulation's, none with --task)")
]
dataset: TypeAlias = Annotated[Dataset, Field(Dataset.EMBEDDED, description="the simulated data set")]
data_dir: TypeAlias = Annotated[
    str, Field("", description="directory holding the simulated data set's files")
]
partition: TypeAlias = Annotated[
    Partition, Field(Partition.IID, description="how training data is split over participants")
]
validation_size: TypeAlias = Annotated[Count, Field(1000, description="validation samples for the utility")]
validation_from: TypeAlias = Annotated[
    ValidationFrom,
    Field(
        ValidationFrom.TRAIN,
        description=(
            "the files the simulation's validation is cut from: the training files (the rest trains) or "
            "the test files (every training image trains; the paper's 100 x 600)"
        ),
    ),
]
test_size: TypeAlias = Annotated[
    int,
    Field(
        1000,
        description="test images the simulation's accuracy is measured on (0: every one not validating)",
        ge=0,
        le=INT32_MAX,
    ),
]
corrupt: TypeAlias = Annotated[
    str,
    Field(
        "",
        description=(
            "per-rank corruptions, e.g. '0-3=flip:0.1;7=backdoor;8=keep:30;9=mimic:1' (flip:R, backdoor, "
            "scale:F, count:N, noise:NORM, replay, mimic[:NOISE], keep:N, copy:RANK (a second identity "
            "with RANK's shard), madeup (trains on made-up inputs and labels), step (adds the federation's "
            "recent step), alie[:TAU] or ipm[:TAU] (the entry's ranks collude); '+' joins several)"
        ),
    ),
]

# training
fraction: TypeAlias = Annotated[
    Fraction, Field(0.5, description="fraction C of participants selected per round")
]
rounds: TypeAlias = Annotated[Count, Field(5, description="training rounds T")]
model: TypeAlias = Annotated[
    ModelName, Field(ModelName.MLP, description="the paper's model (with --dataset)")
]
epochs: TypeAlias = Annotated[Count, Field(5, description="local epochs")]
batch_size: TypeAlias = Annotated[Count, Field(10, description="local batch size")]
lr: TypeAlias = Annotated[Positive, Field(0.05, description="local learning rate")]
draw: TypeAlias = Annotated[
    Draw,
    Field(
        Draw.BALANCED,
        description=(
            "how each round's members are drawn: balanced (seeded blocks of permutations: each member "
            "selected floor(T*K/N) or ceil(T*K/N) times) or independent (each round afresh, the paper's)"
        ),
        json_schema_extra={"later": Draw.INDEPENDENT},  # runs recorded before it drew independently
    ),
]
selection: TypeAlias = Annotated[
    str, Field("", description="fixed per-round selection instead of the seeded draw, e.g. '1=0-4;2=3,7'")
]

# aggregation
aggregation: TypeAlias = Annotated[
    Aggregation, Field(Aggregation.FEDAVG, description="the rule that aggregates a round")
]
aggregation_trim: TypeAlias = Annotated[
    float, Field(0.1, description="trimmed_mean: fraction of values cut at each end")
]
aggregation_byzantine: TypeAlias = Annotated[
    int, Field(1, description="krum, multi_krum: participants assumed malicious (f)")
]
aggregation_keep: TypeAlias = Annotated[
    int, Field(0, description="multi_krum: updates averaged (0 = selected - f)")
]

# guard
update_norm_policy: TypeAlias = Annotated[
    NormPolicy,
    Field(
        NormPolicy.CLIP_OR_REJECT,
        description=(
            "an update whose L2 norm is over the bound: clip-or-reject scales it to the bound when it is a "
            "data-rich member's larger step (more declared samples than the median, along the validation "
            "loss's descent, within --update-norm-reject-multiple x the bound) and drops it otherwise; "
            "reject drops it, clip scales it, none accepts it"
        ),
    ),
]
update_norm_bound: TypeAlias = Annotated[
    float,
    Field(0.0, description="bound on an update's L2 norm (0 = --update-norm-multiple x the round's median)"),
]
update_norm_multiple: TypeAlias = Annotated[
    float, Field(2.0, description="the adaptive bound, as a multiple of the round's median norm")
]
update_norm_reject_multiple: TypeAlias = Annotated[
    float,
    Field(
        4.0,
        description="clip-or-reject: an update over this x the bound is rejected, not clipped",
        ge=1,
        allow_inf_nan=False,
        json_schema_extra={"later": True},
    ),
]
update_count_multiple: TypeAlias = Annotated[
    float,
    Field(
        3.0,
        description=(
            "a FedAvg weight is at most this x the federation's median declared sample count (0 = off)"
        ),
    ),
]
update_direction: TypeAlias = Annotated[
    bool,
    Field(
        True,
        description=(
            "turn away an update that points against the validation loss's descent and the round's other "
            "updates (further than any accepted so far) when the round's FedAvg is better without it, a "
            "null update (a free rider's), one with nothing beyond the global model's recent steps (a "
            "mimic's), and agreeing updates against the descent in a round whose FedAvg is worse than "
            "w_t; off, a zero update or one with nothing beyond those steps but noise is aggregated and "
            "valued 0 (public)"
        ),
    ),
]
update_norm_history: TypeAlias = Annotated[
    int, Field(3, description="past rounds whose accepted update norms join the adaptive bound's median")
]
update_quarantine: TypeAlias = Annotated[
    bool,
    Field(
        True,
        description=(
            "quarantine a member whose updates keep making the validation loss worse (beyond its noise "
            "and the federation's spread): its updates are valued, not aggregated, until they stop"
        ),
    ),
]
update_trusted_step: TypeAlias = Annotated[
    bool,
    Field(
        True,
        description=(
            "train the validation set from w_t as members train (once a round, at the coordinator) and "
            "turn away an update that points against that step, as sign flips and inner-product "
            "manipulation do (FLTrust's server update)"
        ),
    ),
]

# valuation
metric: TypeAlias = Annotated[
    Metric,
    Field(
        Metric.ACCURACY,
        description=(
            "the utility of the built-in models (neg_loss: validation log-likelihood); a --task sets its own"
        ),
    ),
]
valuation: TypeAlias = Annotated[
    ValuationMethod, Field(ValuationMethod.AUTO, description="how each round is valued")
]
eps: TypeAlias = Annotated[float, Field(0.05, description="valuation accuracy epsilon (without a budget)")]
delta: TypeAlias = Annotated[float, Field(0.05, description="valuation failure probability delta")]
valuation_budget: TypeAlias = Annotated[
    int, Field(0, description="distinct utility evaluations per round for sampling (0 = from eps, delta)")
]
valuation_target_stderr: TypeAlias = Annotated[
    NonNegative,
    Field(
        DEFAULT_TARGET_STDERR,
        description=(
            "where auto is not exact, sample until every value's standard error is at most this fraction "
            "of the utility's range; with a noise fraction, only where a round has no validation folds (0"
            " and no noise fraction = the eps/delta budget instead)"
        ),
    ),
]
valuation_noise_fraction: TypeAlias = Annotated[
    NonNegative,
    Field(
        0.5,
        description=(
            "where auto is not exact, sample until every value's standard error is at most this fraction "
            "of its own validation noise (its error against a fresh validation draw grows by sqrt(1 + "
            "f^2) at most); exact when it is not there by half of the coalitions (0 = the absolute target"
            " instead)"
        ),
    ),
]
valuation_surrogate: TypeAlias = Annotated[
    bool,
    Field(
        True,
        description=(
            "where auto samples, sample the residual of the round's model linearized around w_t and add "
            "the linearization's own values back (a control variate), when the first attempt finds the "
            "errors smaller with it"
        ),
    ),
]
valuation_merge_redundant: TypeAlias = Annotated[
    bool,
    Field(
        False,
        description=(
            "value the members of a round whose updates are far more alike than independent data give (a "
            "second identity with a copy of an owner's data) as one player, their value split equally, "
            "aggregate them as one member (FedAvg, Krum: their sample counts divided among them) and pay "
            "members merged in any round as one owner for the run"
        ),
        json_schema_extra={"later": True},
    ),
]
valuation_exact_seconds: TypeAlias = Annotated[
    Positive,
    Field(
        10.0,
        description=(
            "auto is exact outright when 2^m coalitions take at most this many seconds at the cost per "
            "coalition measured on the round's own game"
        ),
    ),
]
valuation_max_evaluations: TypeAlias = Annotated[
    int,
    Field(
        100_000,
        description="the most distinct evaluations a round's sampling to the target may use",
        ge=2,
        le=INT32_MAX,
    ),
]
valuation_budget_seconds: TypeAlias = Annotated[
    NonNegative,
    Field(
        0.0,
        description=(
            "a time budget per round instead of the target, measured on the round's own game: auto is "
            "exact only if 2^m evaluations fit, else samples what fits (0 = none; values then do not "
            "depend on the machine)"
        ),
    ),
]
