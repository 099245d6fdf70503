"""Sampling to a fraction of each value's own validation noise, and "auto" choosing by measured cost."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from fedsv.valuation import ValuationSpec, plan
from fedsv.valuation.accounting.by_class import split_values
from fedsv.valuation.accounting.rounds import value_round
from fedsv.valuation.estimators.api import make_estimator, measure_cost, plan_game
from fedsv.valuation.estimators.estimator import Settings
from fedsv.valuation.estimators.exact import ExactShapley
from fedsv.valuation.estimators.methods import REGISTRY
from fedsv.valuation.estimators.noise_target import NOISE_FLOOR, pooled, thresholds
from fedsv.valuation.estimators.target import ToTarget, first_allowance
from tests.support.games import SampleMaxGame, TableGame, airport, sample_costs, table_of

M, SAMPLES = 12, 400


def costs(seed: int, m: int = M, samples: int = SAMPLES) -> np.ndarray:
    return sample_costs(seed, m, samples)


def to_noise(fraction: float, seed: int, exact_after: int | None = None) -> ToTarget:
    settings = Settings(seed=seed, capped=True)
    return ToTarget(REGISTRY["regression"], settings, 0.002, 2**M, fraction, exact_after)


def test_a_sampler_stops_at_its_fraction_of_each_values_noise_and_is_within_its_error() -> None:
    game = SampleMaxGame(costs(0))
    result = to_noise(0.5, seed=1).run(game)
    target = result.extra["target"]
    assert result.method == "regression" and target["reached"] and not target["finished_exact"]
    assert result.evaluations < 2**M  # it stopped short of enumerating
    limits, stderr = np.asarray(target["thresholds"]), np.asarray(result.stderr)
    assert np.all(stderr <= limits)
    # the thresholds are half the measured noise, which is the closed-form noise (floored alike) to
    # within the error of an 8-fold estimate (a standard error from 7 degrees of freedom: a factor of 2)
    noise = game.validation_noise
    ratio = (limits / 0.5) / np.maximum(noise, NOISE_FLOOR * np.median(noise))
    assert np.all((ratio > 0.4) & (ratio < 2.0)), ratio
    assert np.max(np.abs(result.values - game.values) / stderr) <= 4.5


def test_the_noise_target_is_unbiased_over_seeds() -> None:
    """The mean over seeds of the sampled values lies within its standard error of the closed form."""
    m, seeds = 10, 16
    game_costs = costs(3, m=m, samples=40)  # a small validation set: noisy values, sampling stops early
    settings = [Settings(seed=s, capped=True) for s in range(seeds)]
    runs = [
        ToTarget(REGISTRY["regression"], st, 0.002, 2**m, 1.0).run(SampleMaxGame(game_costs))
        for st in settings
    ]
    assert all(r.method == "regression" and r.evaluations < 2**m for r in runs)
    values = np.stack([r.values for r in runs])
    stderr = np.stack([np.asarray(r.stderr) for r in runs])
    stated = np.sqrt(np.mean(np.square(stderr), axis=0)) / np.sqrt(seeds)
    truth = SampleMaxGame(game_costs).values
    assert np.all(np.abs(values.mean(axis=0) - truth) <= 4 * stated + 1e-9)


def test_a_sampler_not_there_by_exact_after_finishes_exact_at_no_extra_evaluation() -> None:
    game = SampleMaxGame(costs(1))
    result = to_noise(1e-6, seed=0, exact_after=2 ** (M - 1)).run(game)
    assert result.method == "exact" and result.extra["target"]["finished_exact"]
    assert result.evaluations == 2**M  # the sampled coalitions were not evaluated again
    np.testing.assert_allclose(result.values, game.values, atol=1e-12)


def test_a_game_without_validation_folds_samples_to_the_absolute_target() -> None:
    table = table_of(airport([0.05 * (i + 1) for i in range(M)])[0], M)
    result = to_noise(0.5, seed=0).run(TableGame(table))
    assert result.extra["target"]["thresholds"] == 0.002 and np.all(np.asarray(result.stderr) <= 0.002)


def test_thresholds_floor_a_noiseless_value_and_fall_back_without_noise() -> None:
    np.testing.assert_allclose(thresholds(np.array([0.0, 0.01, 0.02]), 0.5, 0.002), [0.00125, 0.005, 0.01])
    np.testing.assert_array_equal(thresholds(np.zeros(3), 0.5, 0.002), [0.002] * 3)


def test_auto_under_a_noise_target_chooses_by_measured_cost_and_says_why() -> None:
    spec = ValuationSpec(noise_fraction=0.5, exact_seconds=10.0)
    small = plan(6, spec)  # 64 coalitions: within a sampler's first attempt
    assert small.method == "exact" and first_allowance(6) >= 2**6 and "first attempt" in small.reason
    cheap = plan(12, spec, seconds_per_evaluation=1e-3)  # 4 s: exact outright
    assert cheap.method == "exact" and "within exact_seconds" in cheap.reason
    dear = plan(12, spec, seconds_per_evaluation=0.03)  # 123 s: sample, exact after half
    assert dear.method == "regression" and dear.exact_after == 2**11 and dear.noise_fraction == 0.5
    assert "exact if not there by 2048" in dear.reason
    big = plan(21, spec, seconds_per_evaluation=1e-3)
    assert big.method == "regression" and big.exact_after is None and "max_exact_players" in big.reason


@pytest.mark.parametrize("fraction", [0.5, 1e-6])
def test_a_noise_plan_replayed_gives_the_same_values_and_a_round_records_its_choice(fraction: float) -> None:
    game_costs = costs(5, samples=40)  # noisy values: the sampler gets there at 0.5
    spec = ValuationSpec(noise_fraction=fraction, exact_seconds=1e-9, seed=4)
    first_game = SampleMaxGame(game_costs)
    chosen = plan_game(first_game, spec)
    assert chosen.method == "regression" and chosen.exact_after == 2 ** (M - 1)
    first = make_estimator(chosen, spec).run(first_game)
    again = make_estimator(chosen, chosen.replay(ValuationSpec(seed=4))).run(SampleMaxGame(game_costs))
    np.testing.assert_array_equal(first.values, again.values)
    rv = value_round(SampleMaxGame(game_costs), [f"p{i}" for i in range(M)], 1, spec)
    np.testing.assert_array_equal(rv.fedsv, first.values)
    ended = "finished exact" if fraction < 1e-3 else "reached after"
    assert "of each value's validation noise" in rv.choice and ended in rv.choice
    assert rv.folds is not None and rv.folds.fedsv.sum(axis=1) == pytest.approx(rv.fedsv, abs=1e-9)
    if fraction < 1e-3:
        assert rv.method == "exact" and np.allclose(
            rv.fedsv, ExactShapley().run(SampleMaxGame(game_costs)).values
        )


class WaitingGame(TableGame):
    """A table game that waits 5 ms per coalition without using the CPU: a busy machine's delay."""

    def _evaluate(self, members: np.ndarray) -> np.ndarray:
        time.sleep(5e-3 * len(members))
        return super()._evaluate(members)


def test_autos_cost_is_cpu_time_so_a_busy_machine_does_not_flip_its_choice() -> None:
    game = WaitingGame(table_of(airport([0.05 * (i + 1) for i in range(M)])[0], M))
    wall, cpu = measure_cost(game), measure_cost(game, busy_proof=True)
    assert wall >= 4e-3  # the wall clock sees the 5 ms wait (a difference of two timings: not to the µs)
    assert cpu < wall / 4, (cpu, wall)  # the process's CPU time does not (other threads' work aside)
    chosen = plan_game(game, ValuationSpec(noise_fraction=0.5, exact_seconds=5.0))
    assert chosen.method == "exact", chosen  # 2^12 x 5 ms of waiting would have made it sample


def test_a_round_finished_exact_splits_exactly_where_its_store_keeps_no_table() -> None:
    """A round finished exact is split by replaying exact on each fold, not the sampler's attempts."""
    game = SampleMaxGame(costs(2))
    game.store._dense = None  # what a store too large for a dense table keeps: a dict per coalition
    spec = ValuationSpec(noise_fraction=1e-6, exact_seconds=1e-9, seed=1)
    rv = value_round(game, [f"p{i}" for i in range(M)], 1, spec)
    assert rv.method == "exact" and rv.folds is not None
    np.testing.assert_allclose(rv.folds.fedsv.sum(axis=1), rv.fedsv, atol=1e-12)
    np.testing.assert_allclose(rv.fedsv, game.values, atol=1e-12)


def test_a_noise_targets_values_per_fold_are_what_a_replay_on_each_fold_gives() -> None:
    """split_values takes the folds' values the noise target kept, instead of replaying the sampler."""
    game_costs = costs(5, samples=40)
    spec = ValuationSpec(noise_fraction=0.5, exact_seconds=1e-9, seed=4)
    game = SampleMaxGame(game_costs)
    chosen = plan_game(game, spec)
    result = make_estimator(chosen, spec).run(game)
    assert result.method == "regression" and result.extra["target"]["fold_values"] is not None
    kept = split_values(game, chosen, spec, result).folds
    target = {**result.extra["target"], "fold_values": None}
    replayed = split_values(
        game, chosen, spec, dataclasses.replace(result, extra={**result.extra, "target": target})
    ).folds
    assert kept is not None and replayed is not None
    np.testing.assert_array_equal(kept.fedsv, replayed.fedsv)


def test_pooling_brings_noisy_noise_estimates_closer_to_the_truth_and_keeps_real_differences() -> None:
    """Noise read off 4 folds (3 degrees of freedom) is pulled towards what the values' sizes predict:
    closer to the true noise on average; a member whose noise truly differs 30-fold keeps it."""
    rng = np.random.default_rng(0)
    values = np.linspace(0.002, 0.04, 20)
    truth = 0.01 * np.sqrt(values)  # more images moved, more noise
    raw_errors, pooled_errors = [], []
    for _ in range(200):
        estimate = truth * np.sqrt(rng.chisquare(3, size=20) / 3)
        raw_errors.append(np.mean(np.square(np.log(estimate / truth))))
        pooled_errors.append(np.mean(np.square(np.log(pooled(estimate, 3, values) / truth))))
    assert np.mean(pooled_errors) < 0.5 * np.mean(raw_errors)
    apart = truth.copy()
    apart[::2] *= 30.0
    kept = pooled(apart * np.sqrt(rng.chisquare(30, size=20) / 30), 30, values)
    assert np.all(kept[::2] > 10 * kept[1::2])
