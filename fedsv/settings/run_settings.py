"""The run's settings, declared once as pydantic fields: data, training, guard, aggregation, valuation."""

from __future__ import annotations

from typing import Any

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

# the library's own fallback is valuation.target.FALLBACK_STDERR: a participant loads this module and
# must not load the valuation layer, so the run declares its default here
DEFAULT_TARGET_STDERR = 0.002
"""The accuracy a sampled value must reach, as a fraction of the utility's range: for accuracy, two
validation images in a thousand."""

RUN_SETTINGS: dict[str, Any] = {  # name -> pydantic FieldInfo (Field's type is its default's)
    # data
    "participants": Field(20, description="number of participants N (world size)", ge=1, le=INT32_MAX),
    "seed": Field(0, description="seed of split, partition, selection and training", ge=0, le=MAX_SEED),
    "task": Field(
        "", description="the run's task, MODULE:ATTR or FILE.py:ATTR ('' = the paper's --model on --dataset)"
    ),
    "validation_data": Field(
        "", description="the coordinator's validation data ('' = the --dataset simulation's split)"
    ),
    "test_data": Field(
        "", description="test data for reported accuracy ('' = the simulation's, none with --task)"
    ),
    "dataset": Field(Dataset.EMBEDDED, description="the simulated data set"),
    "data_dir": Field("", description="directory holding the simulated data set's files"),
    "partition": Field(Partition.IID, description="how training data is split over participants"),
    "validation_size": Field(1000, description="validation samples for the utility", ge=1, le=INT32_MAX),
    "validation_from": Field(
        ValidationFrom.TRAIN,
        description=(
            "the files the simulation's validation is cut from: the training files (the rest trains) or "
            "the test files (every training image trains; the paper's 100 x 600)"
        ),
    ),
    "test_size": Field(
        1000,
        description="test images the simulation's accuracy is measured on (0: every one not validating)",
        ge=0,
        le=INT32_MAX,
    ),
    "corrupt": Field(
        "",
        description=(
            "per-rank corruptions, e.g. '0-3=flip:0.1;7=backdoor;8=keep:30;9=mimic:1' (flip:R, backdoor, "
            "scale:F, count:N, noise:NORM, replay, mimic[:NOISE], keep:N, copy:RANK (a second identity "
            "with RANK's shard), madeup (trains on made-up inputs and labels), step (adds the federation's "
            "recent step), alie[:TAU] or ipm[:TAU] (the entry's ranks collude); '+' joins several)"
        ),
    ),
    # training
    "fraction": Field(0.5, description="fraction C of participants selected per round", gt=0, le=1),
    "rounds": Field(5, description="training rounds T", ge=1, le=INT32_MAX),
    "model": Field(ModelName.MLP, description="the paper's model (with --dataset)"),
    "epochs": Field(5, description="local epochs", ge=1, le=INT32_MAX),
    "batch_size": Field(10, description="local batch size", ge=1, le=INT32_MAX),
    "lr": Field(0.05, description="local learning rate", gt=0, allow_inf_nan=False),
    "draw": Field(
        Draw.BALANCED,
        description=(
            "how each round's members are drawn: balanced (seeded blocks of permutations: each member "
            "selected floor(T*K/N) or ceil(T*K/N) times) or independent (each round afresh, the paper's)"
        ),
        json_schema_extra={"later": Draw.INDEPENDENT},  # runs recorded before it drew independently
    ),
    "selection": Field(
        "", description="fixed per-round selection instead of the seeded draw, e.g. '1=0-4;2=3,7'"
    ),
    # aggregation
    "aggregation": Field(Aggregation.FEDAVG, description="the rule that aggregates a round"),
    "aggregation_trim": Field(0.1, description="trimmed_mean: fraction of values cut at each end"),
    "aggregation_byzantine": Field(1, description="krum, multi_krum: participants assumed malicious (f)"),
    "aggregation_keep": Field(0, description="multi_krum: updates averaged (0 = selected - f)"),
    # guard
    "update_norm_policy": Field(
        NormPolicy.CLIP_OR_REJECT,
        description=(
            "an update whose L2 norm is over the bound: clip-or-reject scales it to the bound when it is a "
            "data-rich member's larger step (more declared samples than the median, along the validation "
            "loss's descent, within --update-norm-reject-multiple x the bound) and drops it otherwise; "
            "reject drops it, clip scales it, none accepts it"
        ),
    ),
    "update_norm_bound": Field(
        0.0, description="bound on an update's L2 norm (0 = --update-norm-multiple x the round's median)"
    ),
    "update_norm_multiple": Field(
        2.0, description="the adaptive bound, as a multiple of the round's median norm"
    ),
    "update_norm_reject_multiple": Field(
        4.0,
        description="clip-or-reject: an update over this x the bound is rejected, not clipped",
        ge=1,
        allow_inf_nan=False,
        json_schema_extra={"later": True},
    ),
    "update_count_multiple": Field(
        3.0,
        description=(
            "a FedAvg weight is at most this x the federation's median declared sample count (0 = off)"
        ),
    ),
    "update_direction": Field(
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
    "update_norm_history": Field(
        3, description="past rounds whose accepted update norms join the adaptive bound's median"
    ),
    "update_quarantine": Field(
        True,
        description=(
            "quarantine a member whose updates keep making the validation loss worse (beyond its noise "
            "and the federation's spread): its updates are valued, not aggregated, until they stop"
        ),
    ),
    # valuation
    "metric": Field(
        Metric.ACCURACY,
        description=(
            "the utility of the built-in models (neg_loss: validation log-likelihood); a --task sets its own"
        ),
    ),
    "valuation": Field(ValuationMethod.AUTO, description="how each round is valued"),
    "eps": Field(0.05, description="valuation accuracy epsilon (without a budget)"),
    "delta": Field(0.05, description="valuation failure probability delta"),
    "valuation_budget": Field(
        0, description="distinct utility evaluations per round for sampling (0 = from eps, delta)"
    ),
    "valuation_target_stderr": Field(
        DEFAULT_TARGET_STDERR,
        description=(
            "where auto is not exact, sample until every value's standard error is at most this fraction "
            "of the utility's range; with a noise fraction, only where a round has no validation folds (0"
            " and no noise fraction = the eps/delta budget instead)"
        ),
        ge=0,
        allow_inf_nan=False,
    ),
    "valuation_noise_fraction": Field(
        0.5,
        description=(
            "where auto is not exact, sample until every value's standard error is at most this fraction "
            "of its own validation noise (its error against a fresh validation draw grows by sqrt(1 + "
            "f^2) at most); exact when it is not there by half of the coalitions (0 = the absolute target"
            " instead)"
        ),
        ge=0,
        allow_inf_nan=False,
    ),
    "valuation_surrogate": Field(
        True,
        description=(
            "where auto samples, sample the residual of the round's model linearized around w_t and add "
            "the linearization's own values back (a control variate), when the first attempt finds the "
            "errors smaller with it"
        ),
    ),
    "valuation_merge_redundant": Field(
        False,
        description=(
            "value the members of a round whose updates are far more alike than independent data give (a "
            "second identity with a copy of an owner's data) as one player, their value split equally, "
            "aggregate them as one member (FedAvg, Krum: their sample counts divided among them) and pay "
            "members merged in any round as one owner for the run"
        ),
        json_schema_extra={"later": True},
    ),
    "valuation_exact_seconds": Field(
        10.0,
        description=(
            "auto is exact outright when 2^m coalitions take at most this many seconds at the cost per "
            "coalition measured on the round's own game"
        ),
        gt=0,
        allow_inf_nan=False,
    ),
    "valuation_max_evaluations": Field(
        100_000,
        description="the most distinct evaluations a round's sampling to the target may use",
        ge=2,
        le=INT32_MAX,
    ),
    "valuation_budget_seconds": Field(
        0.0,
        description=(
            "a time budget per round instead of the target, measured on the round's own game: auto is "
            "exact only if 2^m evaluations fit, else samples what fits (0 = none; values then do not "
            "depend on the machine)"
        ),
        ge=0,
        allow_inf_nan=False,
    ),
}
