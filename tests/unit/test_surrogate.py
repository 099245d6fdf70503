"""The surrogate-corrected sampler: unbiased on closed-form games, within its error of exact values on a
real round, a pilot that drops a surrogate that does not help, and the linearized round game."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedsv.data import load_dataset
from fedsv.fl.state import params_of
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation import ValuationSpec
from fedsv.valuation.accounting.rounds import value_round
from fedsv.valuation.estimators.estimator import Settings
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.estimators.methods import REGISTRY
from fedsv.valuation.estimators.regression import RegressionMSR
from fedsv.valuation.estimators.surrogate import ResidualGame, SurrogateCorrected
from fedsv.valuation.estimators.target import ToTarget
from fedsv.valuation.games.class_scores import CellGame, ClassScores
from fedsv.valuation.games.game import Game, bitmasks
from fedsv.valuation.round.round_game import RoundGame
from tests.support.games import SampleMaxGame, sample_costs

M, SAMPLES = 10, 300


def costs(seed: int, m: int = M, samples: int = SAMPLES) -> np.ndarray:
    return sample_costs(seed, m, samples)


def near(game_costs: np.ndarray, spread: float, seed: int = 99) -> SampleMaxGame:
    """A closed-form surrogate that follows SampleMaxGame(game_costs): its costs moved a little."""
    rng = np.random.default_rng(seed)
    return SampleMaxGame(np.clip(game_costs + spread * rng.standard_normal(game_costs.shape), 0.0, 1.0))


class Scaled(Game):
    """`factor` times a SampleMaxGame, split by fold alike."""

    def __init__(self, inner: SampleMaxGame, factor: float) -> None:
        super().__init__(inner.m)
        self.inner, self.factor = inner, factor
        self.store = ClassScores(inner.m, 1, inner.store.shares)

    def cell_scores(self) -> ClassScores:
        return self.store

    def _evaluate(self, members: np.ndarray) -> np.ndarray:
        utilities, masks, inner = self.inner.utilities(members), bitmasks(members), self.inner.store
        cells = np.stack([inner.get(masks, inner.fold(f)) for f in range(inner.folds)], axis=1)
        self.store.add(masks, self.factor * cells)
        return self.factor * utilities


def to_noise(fraction: float, seed: int, m: int = M) -> ToTarget:
    return ToTarget(REGISTRY["regression"], Settings(seed=seed, capped=True), 0.002, 2**m, fraction)


@pytest.mark.parametrize("wrapped", ["budget", "noise target"])
def test_the_corrected_sampler_is_unbiased_over_seeds(wrapped: str) -> None:
    """The mean over 16 seeds lies within its standard error of the closed form (phi(U) = phi(G) +
    phi(U - G), G's values exact, the residual sampled)."""
    game_costs, seeds = costs(0), 16
    truth = SampleMaxGame(game_costs).values
    runs = []
    for seed in range(seeds):
        inner = RegressionMSR(120, seed=seed) if wrapped == "budget" else to_noise(1.0, seed)
        corrected = SurrogateCorrected(inner, Settings(seed=seed), near(game_costs, 0.05))
        runs.append(corrected.run(SampleMaxGame(game_costs)))
    assert all(r.extra["control_variate"]["used"] and r.method == "regression" for r in runs)
    values = np.stack([r.values for r in runs])
    stderr = np.stack([np.asarray(r.stderr) for r in runs])
    stated = np.sqrt(np.mean(np.square(stderr), axis=0)) / np.sqrt(seeds)
    assert np.all(np.abs(values.mean(axis=0) - truth) <= 4 * stated + 1e-12)
    # each run is within its own stated error too, and efficient
    assert max(float(np.max(np.abs(r.values - truth) / r.stderr)) for r in runs) <= 5.0
    for r in runs:
        assert r.values.sum() == pytest.approx(r.utility_grand - r.utility_empty, abs=1e-9)


def test_a_surrogate_that_follows_the_game_makes_the_errors_smaller_at_the_same_evaluations() -> None:
    game_costs = costs(1)
    truth = SampleMaxGame(game_costs).values
    plain, corrected = [], []
    for seed in range(8):
        plain.append(RegressionMSR(120, seed=seed).run(SampleMaxGame(game_costs)))
        wrapped = SurrogateCorrected(
            RegressionMSR(120, seed=seed), Settings(seed=seed), near(game_costs, 0.02)
        )
        corrected.append(wrapped.run(SampleMaxGame(game_costs)))
    assert {r.evaluations for r in plain} == {r.evaluations for r in corrected}  # U's, the costly ones
    rmse = [np.sqrt(np.mean([np.square(r.values - truth) for r in runs])) for runs in (plain, corrected)]
    assert rmse[1] < rmse[0] / 2, rmse
    stated = [np.median([np.asarray(r.stderr) for r in runs]) for runs in (plain, corrected)]
    assert stated[1] < stated[0] / 2, stated
    assert corrected[0].extra["control_variate"]["explained"] > 0.5


def test_the_pilot_drops_a_surrogate_that_does_not_help_and_the_run_is_the_plain_one() -> None:
    game_costs = costs(2)
    unrelated = Scaled(SampleMaxGame(game_costs), -2.0)  # U - G = 3 U: three times the error
    corrected = SurrogateCorrected(to_noise(0.5, seed=4), Settings(seed=4), unrelated).run(
        SampleMaxGame(game_costs)
    )
    plain = to_noise(0.5, seed=4).run(SampleMaxGame(game_costs))
    info = corrected.extra["control_variate"]
    assert not info["used"] and "dropped" in info["reason"]
    np.testing.assert_array_equal(corrected.values, plain.values)
    assert corrected.evaluations == plain.evaluations  # the pilot's coalitions were not evaluated again


def test_one_player_is_valued_exactly() -> None:
    one = SampleMaxGame(costs(7, m=1))
    result = SurrogateCorrected(to_noise(0.5, seed=0, m=1), Settings()).run(one)
    assert result.method == "exact"
    np.testing.assert_allclose(result.values, one.values, atol=1e-12)


def test_a_game_without_a_surrogate_is_valued_by_the_sampler_alone() -> None:
    game_costs = costs(4)
    result = SurrogateCorrected(to_noise(0.5, seed=1), Settings(seed=1)).run(SampleMaxGame(game_costs))
    plain = to_noise(0.5, seed=1).run(SampleMaxGame(game_costs))
    assert not result.extra["control_variate"]["used"]
    np.testing.assert_array_equal(result.values, plain.values)


def test_the_noise_target_reads_the_folds_with_the_surrogates_values_added_back() -> None:
    """The target's values per fold are U's (the residual's plus G's): they add up to the values."""
    game_costs = costs(5)
    surrogate, game = near(game_costs, 0.05), SampleMaxGame(game_costs)
    result = SurrogateCorrected(to_noise(0.5, seed=2), Settings(seed=2), surrogate).run(game)
    folds = np.asarray(result.extra["target"]["fold_values"])
    np.testing.assert_allclose(folds.sum(axis=1), result.values, atol=1e-9)
    limits = np.asarray(result.extra["target"]["thresholds"]) / 0.5
    # the limits follow U's noise (measured 1.03 of it; 8 folds estimate it within about 25%), not the
    # residual's, which is 0.58 of U's here: read from the residual they would sit at about 0.6
    residual = surrogate.per_sample - game.per_sample
    residual_noise = residual.std(axis=1, ddof=1) / np.sqrt(residual.shape[1])
    assert np.median(residual_noise / game.validation_noise) < 0.7  # the two are told apart
    assert np.median(limits / game.validation_noise) == pytest.approx(1.0, rel=0.2)


def test_beyond_sixteen_players_the_surrogates_values_are_sampled_and_still_add_back() -> None:
    """m = 18: G's values come from a regression over 16,384 of its coalitions (its error stated), its
    values per cell from the same draws in one pass, each what a run on that cell's game alone gives;
    the noise target's folds and the values stay U's, within their error of the closed form."""
    m = 18
    game_costs = costs(6, m=m, samples=200)
    result = SurrogateCorrected(to_noise(1.0, seed=3, m=m), Settings(seed=3), near(game_costs, 0.05)).run(
        SampleMaxGame(game_costs)
    )
    info = result.extra["control_variate"]
    assert info["used"] and info["budget"] == 2**14 and info["stderr"] is not None
    store = info["game"].cell_scores()
    assert info["cells"].shape == (m, store.width)
    np.testing.assert_allclose(info["cells"].sum(axis=1), info["values"], atol=1e-9)
    for cell in (0, store.width // 2, store.width - 1):  # one pass over every cell = a run on each alone
        alone = RegressionMSR(2**14, seed=4).run(CellGame(store, [cell])).values
        np.testing.assert_allclose(info["cells"][:, cell], alone, atol=1e-9)
    assert info["label_stderr"].shape == (m, store.classes)
    for label in (0, store.classes - 1):  # G's own error per label, for the split by label
        run = RegressionMSR(2**14, seed=4).run(CellGame(store, store.label(label)))
        assert run.stderr is not None and np.all(run.stderr > 0)
        np.testing.assert_allclose(info["label_stderr"][:, label], run.stderr, rtol=1e-9)
    assert result.evaluations < 2**m // 8
    folds = np.asarray(result.extra["target"]["fold_values"])
    np.testing.assert_allclose(folds.sum(axis=1), result.values, atol=1e-9)
    truth = SampleMaxGame(game_costs).values
    assert np.max(np.abs(result.values - truth) / np.asarray(result.stderr)) <= 5.0


def linear_round(metric: str) -> RoundGame:
    """A model whose logits are linear in its parameters (softmax regression): its linearization is
    the model itself."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).double()
    w = params_of(model)
    deltas = [{k: 0.5 * torch.randn_like(v) for k, v in w.items()} for _ in range(5)]
    x, y = torch.randn(60, 3, 4, dtype=torch.float64), torch.randint(0, 4, (60,))
    return RoundGame(model, w, deltas, [3, 5, 7, 9, 11], x, y, metric=metric)


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_a_linear_models_linearized_round_is_the_round_itself(metric: str) -> None:
    game = linear_round(metric)
    surrogate = game.surrogate()
    assert surrogate is not None and surrogate is game.surrogate()  # built once
    exact = ExactShapley().run(ResidualGame(game, surrogate))
    np.testing.assert_allclose(exact.values, 0.0, atol=1e-9)
    np.testing.assert_allclose(
        ExactShapley().run(surrogate).values, ExactShapley().run(game).values, atol=1e-9
    )


def test_a_coordinatewise_rule_has_no_linearized_surrogate() -> None:
    game = linear_round("accuracy")
    median = RoundGame(game.model, game.inputs.global_params, [
        {k: v[i].reshape(game.inputs.global_params[k].shape) for k, v in game.inputs.delta_matrices.items()}
        for i in range(game.m)
    ], [1] * game.m, game.inputs.x_val, game.inputs.y_val, aggregation="median")  # fmt: skip
    assert median.surrogate() is None


class NoForwardDerivative(torch.autograd.Function):
    """A custom operation with a backward but no forward-mode derivative (jvp)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class Opaque(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NoForwardDerivative.apply(x)


def small_round(*layers: nn.Module) -> RoundGame:
    torch.manual_seed(1)
    model = nn.Sequential(*layers).double()
    model.eval()
    state = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    deltas = [{k: 0.1 * torch.randn_like(v) for k, v in state.items()} for _ in range(4)]
    x, y = torch.randn(40, 2, 6, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    return RoundGame(model, state, deltas, [5, 5, 5, 5], x, y, metric="neg_loss")


def test_a_model_with_batchnorm_is_linearized_in_its_parameters_with_its_statistics_held() -> None:
    """BatchNorm's running statistics have no forward derivative in torch: they stay w_t's in G, and
    the corrected values are still exact when G is (all 2^4 coalitions of U sampled)."""
    bn = (nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    game = small_round(*bn)
    surrogate = game.surrogate()
    assert surrogate is not None
    result = SurrogateCorrected(RegressionMSR(2**4, seed=0), Settings(), surrogate).run(game)
    np.testing.assert_allclose(result.values, ExactShapley().run(small_round(*bn)).values, atol=1e-9)


def test_a_model_torch_cannot_linearize_has_no_surrogate_and_is_valued_plainly() -> None:
    layers = (Opaque(), nn.Flatten(), nn.Linear(2 * 6 * 6, 3))
    game = small_round(*layers)
    assert game.surrogate() is None
    result = SurrogateCorrected(to_noise(0.5, seed=0, m=4), Settings()).run(game)
    assert not result.extra["control_variate"]["used"]


@pytest.fixture(scope="module")
def mlp_round() -> RoundGame:
    """A real round: an MLP's 10 participants after a few SGD steps each, 400 validation images."""
    splits = load_dataset("embedded", seed=0, validation_size=400, test_size=100)
    model = build_model("mlp", (1, 28, 28), seed=1)
    start = params_of(model)
    deltas = []
    for i in range(M):
        xs, ys = splits.train.x[40 * i : 40 * (i + 1)], splits.train.y[40 * i : 40 * (i + 1)]
        deltas.append(local_update(model, start, xs, ys, TrainConfig(batch_size=8, lr=0.1), seed=i))
    return RoundGame(model, start, deltas, [40] * M, splits.validation.x, splits.validation.y)


def fresh(game: RoundGame) -> RoundGame:
    inputs = game.inputs
    deltas = [
        {k: inputs.delta_matrix(k)[i].reshape(v.shape) for k, v in inputs.global_params.items()}
        for i in range(game.m)
    ]
    return RoundGame(
        game.model, inputs.global_params, deltas, inputs.weights.tolist(), inputs.x_val, inputs.y_val
    )


def test_a_real_round_valued_with_its_surrogate_is_within_its_error_and_splits_consistently(
    mlp_round: RoundGame,
) -> None:
    exact = ExactShapley().run(fresh(mlp_round)).values
    spec = ValuationSpec(target_stderr=0.002, noise_fraction=0.25, exact_seconds=1e-9, seed=3)
    rv = value_round(fresh(mlp_round), [f"p{i}" for i in range(M)], 1, spec)
    assert rv.method == "regression" and "corrected by the game's surrogate" in rv.choice, rv.choice
    assert rv.evaluations < 2**M
    assert np.max(np.abs(rv.fedsv - exact) / rv.stderr) <= 5.0
    assert rv.classes is not None and rv.folds is not None
    np.testing.assert_allclose(rv.classes.values.sum(axis=1), rv.fedsv, atol=1e-9)
    np.testing.assert_allclose(rv.folds.fedsv.sum(axis=1), rv.fedsv, atol=1e-9)
    plain = value_round(fresh(mlp_round), [f"p{i}" for i in range(M)], 1, ValuationSpec(
        target_stderr=0.002, noise_fraction=0.25, exact_seconds=1e-9, seed=3, surrogate=False
    ))  # fmt: skip
    assert "surrogate" not in plain.choice
    assert rv.evaluations < plain.evaluations  # the surrogate's gain on the MLP


def test_auto_plans_the_surrogate_only_where_the_coalitions_pay_for_its_set_up() -> None:
    from fedsv.valuation.estimators.api import plan

    spec = ValuationSpec(target_stderr=0.002, noise_fraction=0.5, exact_seconds=1e-9)
    cheap, costly = plan(20, spec, 0.0001), plan(20, spec, 0.0007)  # a tiny model's and the MLP's
    assert not cheap.surrogate and "no surrogate" in cheap.reason
    assert costly.surrogate and "no surrogate" not in costly.reason
    loose = ValuationSpec(target_stderr=0.002, noise_fraction=1.0, exact_seconds=1e-9)
    assert not plan(20, loose, 0.0007).surrogate  # at f = 1 a plain sampler stops soon enough
    assert plan(20, loose, 0.014).surrogate  # the MNIST CNN's coalitions
    assert plan(10, spec, 0.0007).surrogate  # exact surrogate values: the pilot alone decides
    assert not plan(
        20, ValuationSpec(target_stderr=0.002, noise_fraction=0.5, surrogate=False), 0.0007
    ).surrogate
    assert not cheap.replay(spec).surrogate and costly.replay(spec).surrogate  # a replay decides alike
