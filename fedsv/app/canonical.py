"""A federation's canonical Shapley value: every coalition of its members retrained as the run trains."""

from __future__ import annotations

from collections.abc import Sequence

from fedsv.app.demo import DemoConfig, demo_rounds
from fedsv.fl.evaluation import to_tensors
from fedsv.fl.ranks import participant_id
from fedsv.settings.choices import NormPolicy
from fedsv.settings.run import UNGUARDED
from fedsv.task.sources import evaluation_samples
from fedsv.valuation.estimators.canonical import CanonicalValues, canonical_values
from fedsv.valuation.round.round_inputs import score_params

RETRAINING = {**UNGUARDED, "update_norm_policy": NormPolicy.NONE}
"""The guard and the norm bound off: the canonical value retrains what the members' data train, not what
the coordinator's screens make of a coalition of one or two (docs/decisions/0003)."""


def coalition_score(config: DemoConfig, coalition: frozenset[int]) -> float:
    """The validation score of the model that `coalition`'s ranks train together over the run's rounds,
    every one of them in every round, from the run's initial model (its seed) with the run's local
    training and aggregation, the guard and the norm bound off (RETRAINING); the empty coalition's is the
    initial model's score."""
    config = config.model_copy(update=RETRAINING)
    task = config.load_task()
    if not coalition:
        samples = evaluation_samples(task, config.validation_source, "validation", config.simulation())
        return score_params(
            task.build_model(config.seed), None, *to_tensors(samples.x, samples.y), task.metric
        )
    last = None
    for trained, _ in demo_rounds(config, sorted(coalition)):
        last = trained
    if last is None:
        raise ValueError("the canonical value needs at least one round")
    return score_params(
        last.model, last.after, *to_tensors(last.validation.x, last.validation.y), task.metric
    )


def federation_canonical(config: DemoConfig, seeds: Sequence[int]) -> CanonicalValues:
    """The canonical Shapley value of `config`'s members: all 2^N coalitions retrained with each seed
    (the run's seed replaced), scored on the run's validation set."""
    members = [participant_id(rank) for rank in range(config.participants)]
    return canonical_values(
        members,
        lambda coalition, seed: coalition_score(config.model_copy(update={"seed": seed}), coalition),
        seeds,
    )
