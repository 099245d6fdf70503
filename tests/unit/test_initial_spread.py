"""The pot's part of a rerun: the validation scores of other initial models, and their spread."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from fedsv.fl.evaluation import evaluate
from fedsv.valuation.round.initial_spread import (
    INITIALIZATIONS,
    initial_scores,
    initialization_seeds,
    measure,
    reinitialized,
    seeded,
    spread,
)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))


def test_the_other_seeds_are_fixed_by_the_run_seed_and_never_its_own() -> None:
    seeds = initialization_seeds(7)
    assert seeds == initialization_seeds(7) and seeds != initialization_seeds(8)
    assert 7 not in seeds and len(set(seeds)) == len(seeds) <= INITIALIZATIONS


def test_scores_are_the_validation_metric_of_each_initial_model() -> None:
    x, y = torch.randn(300, 5), torch.randint(0, 3, (300,))
    build = seeded(_model)
    scores = initial_scores(build, x, y, "accuracy", [1, 2])
    assert scores == [evaluate(build(1), None, x, y)[0], evaluate(build(2), None, x, y)[0]]
    losses = initial_scores(build, x, y, "neg_loss", [1])
    assert math.isclose(losses[0], -evaluate(build(1), None, x, y)[1], rel_tol=1e-6)
    measured = measure(build, x, y, "accuracy", 0)
    assert list(measured) == initialization_seeds(0) and 0.0 < spread(list(measured.values())) < 0.5


def test_a_model_without_its_factory_is_reinitialized_per_seed() -> None:
    model = _model()
    build = reinitialized(model)
    first, again, other = build(1), build(1), build(2)
    weight = dict(model.named_parameters())["0.weight"]
    assert torch.equal(dict(first.named_parameters())["0.weight"], dict(again.named_parameters())["0.weight"])
    assert not torch.equal(
        dict(first.named_parameters())["0.weight"], dict(other.named_parameters())["0.weight"]
    )
    assert not torch.equal(
        dict(first.named_parameters())["0.weight"], weight
    )  # the model itself is untouched
    assert torch.equal(weight, dict(model.named_parameters())["0.weight"])


def test_the_spread_is_unknown_with_fewer_than_two_scores() -> None:
    assert math.isnan(spread([])) and math.isnan(spread([0.5, math.nan]))
    assert math.isclose(spread([0.25, 0.75]), float(np.std([0.25, 0.75], ddof=1)))
