"""How much the pot a run splits hangs on its initial model: the validation scores of other initial models.

The round values add up to U(final) - U(w_0): a rerun with another seed starts from another w_0, and on
a small task the initial model's validation score moves far more than the final model's (the tabular
example's: 0.25 to 0.63 over 12 seeds, the final 0.92 to 0.98), so the first round's gain, and with
it every member's total, moves with it. One run cannot see that from its values, so the coordinator
scores INITIALIZATIONS other initial models (the task's model under other seeds) on the validation set
when a run starts: forward passes on data it holds, no message. Their spread is the pot's part of a
rerun (rerun_noise.simulate shifts the first round's values by a draw of it).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from fedsv.fl.evaluation import ArrayOrTensor, to_tensors
from fedsv.valuation.round.round_inputs import Metric, score_params

INITIALIZATIONS = 16
"""Other initial models scored per run (the relative error of their spread is about 1/sqrt(2 * 15))."""


def initialization_seeds(seed: int, count: int = INITIALIZATIONS) -> list[int]:
    """The seeds of the other initial models of a run seeded `seed` (never `seed` itself)."""
    return [int(s) for s in np.random.default_rng([seed, 0x1D17]).integers(0, 2**31 - 1, count) if s != seed]


def initial_scores(
    build: Callable[[int], nn.Module],
    x: ArrayOrTensor,
    y: ArrayOrTensor,
    metric: Metric,
    seeds: Sequence[int],
) -> list[float]:
    """The validation score (the utility's metric) of the initial model `build(seed)` for each seed."""
    xt, yt = to_tensors(x, y)
    return [score_params(build(seed), None, xt, yt, metric) for seed in seeds]


def measure(
    build: Callable[[int], nn.Module], x: ArrayOrTensor, y: ArrayOrTensor, metric: Metric, seed: int
) -> dict[int, float]:
    """seed -> validation score of each of a run's other initial models (initialization_seeds)."""
    seeds = initialization_seeds(seed)
    return dict(zip(seeds, initial_scores(build, x, y, metric, seeds), strict=True))


def seeded(factory: Callable[[], nn.Module]) -> Callable[[int], nn.Module]:
    """A builder of initial models from a factory that takes no seed: torch's generator seeded around it."""

    def build(seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return factory()

    return build


def reinitialized(model: nn.Module) -> Callable[[int], nn.Module]:
    """A builder of other initial models of `model` without its factory (an integration given a model
    only): a copy whose every submodule with reset_parameters() is reset under the seed. Parameters no
    submodule resets keep their values, so the spread may be understated for such a model."""

    def build(seed: int) -> nn.Module:
        other = copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in other.modules():
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()
        return other

    return build


def spread(scores: Sequence[float]) -> float:
    """The standard deviation of the initial models' scores (NaN with fewer than two: unknown)."""
    values = [s for s in scores if math.isfinite(s)]
    return float(np.std(values, ddof=1)) if len(values) >= 2 else math.nan
