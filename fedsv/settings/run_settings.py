"""The run's settings, declared once: data, training, guard, aggregation and valuation (RunConfig)."""

from __future__ import annotations

from fedsv.config.checks import MAX_SEED
from fedsv.settings.choices import (
    Aggregation,
    Dataset,
    Metric,
    ModelName,
    NormPolicy,
    Partition,
    ValidationFrom,
    ValuationMethod,
)
from fedsv.settings.declaration import Count, NonNegative, Positive, Section, Setting, Share

# the library's own fallback is valuation.target.FALLBACK_STDERR: a participant loads this module and
# must not load the valuation layer, so the run declares its default here
DEFAULT_TARGET_STDERR = 0.002
"""The accuracy a sampled value must reach, as a fraction of the utility's range: for accuracy, two
validation images in a thousand."""

D, T, G, A, V = Section.DATA, Section.TRAINING, Section.GUARD, Section.AGGREGATION, Section.VALUATION

RUN_SETTINGS: dict[str, Setting] = {
    # data
    "participants": Setting(D, 20, "number of participants N (world size)", Count()),
    "seed": Setting(D, 0, "seed of split, partition, selection and training", Count(0, MAX_SEED)),
    "task": Setting(
        D, "", "the run's task, MODULE:ATTR or FILE.py:ATTR ('' = the paper's --model on --dataset)"
    ),
    "validation_data": Setting(
        D, "", "the coordinator's validation data ('' = the --dataset simulation's split)"
    ),
    "test_data": Setting(D, "", "test data for reported accuracy ('' = the simulation's, none with --task)"),
    "dataset": Setting(D, Dataset.EMBEDDED, "the simulated data set", choices=Dataset),
    "data_dir": Setting(D, "", "directory holding the simulated data set's files"),
    "partition": Setting(D, Partition.IID, "how training data is split over participants", choices=Partition),
    "validation_size": Setting(D, 1000, "validation samples for the utility", Count()),
    "validation_from": Setting(
        D,
        ValidationFrom.TRAIN,
        "the files the simulation's validation is cut from: the training files (the rest trains) or the "
        "test files (every training image trains; the paper's 100 x 600)",
        choices=ValidationFrom,
    ),
    "test_size": Setting(
        D,
        1000,
        "test images the simulation's accuracy is measured on (0: every one not validating)",
        Count(0),
    ),
    "corrupt": Setting(
        D,
        "",
        "per-rank corruptions, e.g. '0-3=flip:0.1;7=backdoor;8=keep:30;9=mimic:1' (flip:R, backdoor, "
        "scale:F, count:N, noise:NORM, replay, mimic[:NOISE], keep:N, copy:RANK (a second identity with "
        "RANK's shard); '+' joins several)",
    ),
    # training
    "fraction": Setting(T, 0.5, "fraction C of participants selected per round", Share()),
    "rounds": Setting(T, 5, "training rounds T", Count()),
    "model": Setting(T, ModelName.MLP, "the paper's model (with --dataset)", choices=ModelName),
    "epochs": Setting(T, 5, "local epochs", Count()),
    "batch_size": Setting(T, 10, "local batch size", Count()),
    "lr": Setting(T, 0.05, "local learning rate", Positive()),
    "selection": Setting(T, "", "fixed per-round selection instead of the seeded draw, e.g. '1=0-4;2=3,7'"),
    # aggregation
    "aggregation": Setting(A, Aggregation.FEDAVG, "the rule that aggregates a round", choices=Aggregation),
    "aggregation_trim": Setting(A, 0.1, "trimmed_mean: fraction of values cut at each end"),
    "aggregation_byzantine": Setting(A, 1, "krum, multi_krum: participants assumed malicious (f)"),
    "aggregation_keep": Setting(A, 0, "multi_krum: updates averaged (0 = selected - f)"),
    # guard
    "update_norm_policy": Setting(
        G, NormPolicy.REJECT, "an update whose L2 norm is over the bound", choices=NormPolicy
    ),
    "update_norm_bound": Setting(
        G, 0.0, "bound on an update's L2 norm (0 = --update-norm-multiple x the round's median)"
    ),
    "update_norm_multiple": Setting(G, 2.0, "the adaptive bound, as a multiple of the round's median norm"),
    "update_count_multiple": Setting(
        G, 3.0, "a FedAvg weight is at most this x the federation's median declared sample count (0 = off)"
    ),
    "update_direction": Setting(
        G,
        True,
        "turn away an update that points against the validation loss's descent and the round's other "
        "updates (further than any accepted so far) when the round's FedAvg is better without it, a null "
        "update (a free rider's), and agreeing updates against the descent in a round whose FedAvg is "
        "worse than w_t",
    ),
    "update_norm_history": Setting(
        G, 3, "past rounds whose accepted update norms join the adaptive bound's median"
    ),
    "update_quarantine": Setting(
        G,
        True,
        "quarantine a member whose updates keep making the validation loss worse (beyond its noise and "
        "the federation's spread): its updates are valued, not aggregated, until they stop",
    ),
    # valuation
    "metric": Setting(
        V,
        Metric.ACCURACY,
        "the utility of the built-in models (neg_loss: validation log-likelihood); a --task sets its own",
        choices=Metric,
    ),
    "valuation": Setting(V, ValuationMethod.AUTO, "how each round is valued", choices=ValuationMethod),
    "eps": Setting(V, 0.05, "valuation accuracy epsilon (without a budget)"),
    "delta": Setting(V, 0.05, "valuation failure probability delta"),
    "valuation_budget": Setting(
        V, 0, "distinct utility evaluations per round for sampling (0 = from eps, delta)"
    ),
    "valuation_target_stderr": Setting(
        V,
        DEFAULT_TARGET_STDERR,
        "where auto is not exact, sample until every value's standard error is at most this fraction of "
        "the utility's range; with a noise fraction, only where a round has no validation folds (0 and no "
        "noise fraction = the eps/delta budget instead)",
        NonNegative(),
    ),
    "valuation_noise_fraction": Setting(
        V,
        0.5,
        "where auto is not exact, sample until every value's standard error is at most this fraction of "
        "its own validation noise (its error against a fresh validation draw grows by sqrt(1 + f^2) at "
        "most); exact when it is not there by half of the coalitions (0 = the absolute target instead)",
        NonNegative(),
    ),
    "valuation_surrogate": Setting(
        V,
        True,
        "where auto samples, sample the residual of the round's model linearized around w_t and add the "
        "linearization's own values back (a control variate), when the first attempt finds the errors "
        "smaller with it",
    ),
    "valuation_merge_redundant": Setting(
        V,
        False,
        "value the members of a round whose updates are far more alike than independent data give (a "
        "second identity with a copy of an owner's data) as one player, their value split equally",
        later=True,
    ),
    "valuation_exact_seconds": Setting(
        V,
        10.0,
        "auto is exact outright when 2^m coalitions take at most this many seconds at the cost per "
        "coalition measured on the round's own game",
        Positive(),
    ),
    "valuation_max_evaluations": Setting(
        V, 100_000, "the most distinct evaluations a round's sampling to the target may use", Count(2)
    ),
    "valuation_budget_seconds": Setting(
        V,
        0.0,
        "a time budget per round instead of the target, measured on the round's own game: auto is exact "
        "only if 2^m evaluations fit, else samples what fits (0 = none; values then do not depend on the "
        "machine)",
        NonNegative(),
    ),
}
