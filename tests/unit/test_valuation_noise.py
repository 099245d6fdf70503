"""A total's error against a rerun: the validation set's part from folds, a rerun's from simulation."""

from __future__ import annotations

import math

import numpy as np

from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.by_class import FoldValues
from fedsv.valuation.class_scores import fold_of, fold_split
from fedsv.valuation.completion import Model
from fedsv.valuation.rerun_noise import training_noise
from fedsv.valuation.round_matrices import fold_stderr, merge_folds


def test_the_fold_error_of_a_mean_is_its_standard_error() -> None:
    """A value that is the mean of per-sample values: the folds' spread gives sd / sqrt(n)."""
    rng = np.random.default_rng(0)
    errors, spread = [], []
    for _ in range(400):
        per_sample = rng.normal(0.0, 1.0, 800)
        fold, shares = fold_split(800, 8)
        folds = np.array([per_sample[fold == f].sum() / 800 for f in range(8)])
        errors.append(float(fold_stderr(folds, shares)))
        spread.append(per_sample.mean())
    assert abs(np.mean(errors) / np.std(spread) - 1.0) < 0.1  # 1 / sqrt(800) both ways


def test_folds_nest_so_rounds_split_differently_still_add_up() -> None:
    base = fold_of(100)
    assert np.array_equal((base % 4) % 2, base % 2) and np.array_equal((base % 8) % 4, base % 4)
    values = np.arange(8.0)[None, :]
    merged, shares = merge_folds(values, np.full(8, 1 / 8), 4)
    assert merged.tolist() == [[4.0, 6.0, 8.0, 10.0]] and np.allclose(shares, 0.25)
    assert math.isnan(float(fold_stderr(np.ones((1, 1)), np.ones(1))[0]))


def test_a_rerun_error_matches_the_spread_of_simulated_federations() -> None:
    """Members of quality q_i in rounds of gain g_t with Gaussian training noise, half selected per round:
    the error stated from one run is close to the spread of the totals over many such runs."""
    rng = np.random.default_rng(3)
    rounds, members, picked, noise = 12, 10, 5, 0.01
    quality, gain = rng.uniform(0.5, 1.5, members), np.linspace(1.0, 0.2, rounds) * 0.02

    def one_run(seed: int) -> FederatedValuation:
        r = np.random.default_rng(seed)
        fv = FederatedValuation([f"p{i}" for i in range(members)])
        for t in range(rounds):
            chosen = np.sort(r.choice(members, picked, replace=False))
            values = quality[chosen] * gain[t] + r.normal(0, noise, picked)
            folds = FoldValues(
                np.repeat(values[:, None] / 2, 2, axis=1), np.zeros((picked, 2)), np.full(2, 0.5)
            )  # no validation noise in this game
            ids = [f"p{i}" for i in chosen]
            after = float(values.sum())
            zeros = np.zeros(picked)
            rv = RoundValues(t + 1, ids, values, zeros, 0.0, after, "exact", 1, 0.0, zeros, folds=folds)
            fv.add_round(rv)
        return fv

    runs = [one_run(seed) for seed in range(60)]
    for key in ("fedsv", "fedsv_completed"):
        totals = np.array([[fv.totals()[key][f"p{i}"] for i in range(members)] for fv in runs[:60]])
        actual = totals.std(axis=0, ddof=1)
        stated = np.array([[fv.errors()[key][f"p{i}"] for i in range(members)] for fv in runs[:8]]).mean(
            axis=0
        )
        ratio = float(np.median(actual / stated))
        assert 0.7 < ratio < 1.4, (key, ratio)


def test_training_noise_is_what_the_model_leaves_beyond_known_errors() -> None:
    rng = np.random.default_rng(1)
    values = np.outer(np.ones(40), rng.normal(0, 1, 20)) + rng.normal(0, 0.3, (40, 20))
    mask = np.ones_like(values, dtype=bool)
    fitted = training_noise(values, mask, np.zeros_like(values), Model("member means"), 0)
    assert fitted is not None and abs(float(np.median(fitted[1])) - 0.3) < 0.05
    known = np.full_like(values, 0.3**2)  # everything explained by known errors: no training noise left
    _, left = training_noise(values, mask, known, Model("member means"), 0) or (None, np.ones(1))
    assert float(np.median(left)) < 0.1
