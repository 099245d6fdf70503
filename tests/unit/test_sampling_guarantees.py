"""The sampling estimators' (eps, delta) guarantees, evaluation bounds, and the paper's pseudo-code bugs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsv.valuation.estimators.exact import ExactShapley, all_coalitions
from fedsv.valuation.estimators.group_testing import (
    GroupTesting,
    group_testing_budget,
    harmonic_z,
    size_distribution,
)
from fedsv.valuation.estimators.permutation import PermutationSampling
from tests.support.games import TableGame, all_closed_form, random_table, scaled_into, table_of

ESTIMATORS: dict[str, type[PermutationSampling] | type[GroupTesting]] = {
    "permutation": PermutationSampling,
    "group_testing": GroupTesting,
}
TRIALS = 40


def exact(table: np.ndarray) -> np.ndarray:
    return ExactShapley().run(TableGame(table)).values


def success_rate(method: str, tables: list[np.ndarray], eps: float, delta: float, r: float) -> float:
    hits = 0
    for seed, table in enumerate(tables):
        estimate = ESTIMATORS[method](eps, delta, utility_range=r, seed=seed).run(TableGame(table))
        hits += bool(np.max(np.abs(estimate.values - exact(table))) <= eps)
    return hits / len(tables)


@pytest.mark.parametrize("method", sorted(ESTIMATORS))
@pytest.mark.parametrize(("m", "r"), [(6, 1.0), (8, 2.0)])
def test_guarantee_on_random_games(method: str, m: int, r: float) -> None:
    eps, delta = 0.1 * r, 0.1
    tables = [random_table(m, np.random.default_rng(1000 + seed), r) for seed in range(TRIALS)]
    assert success_rate(method, tables, eps, delta, r) >= 1 - delta


@pytest.mark.parametrize("method", sorted(ESTIMATORS))
def test_guarantee_on_closed_form_games(method: str) -> None:
    eps, delta, r = 0.1, 0.1, 1.0
    games = [scaled_into(table_of(u, m), r) for u, m, _ in all_closed_form().values()]
    tables = [games[k % len(games)] for k in range(TRIALS)]
    assert success_rate(method, tables, eps, delta, r) >= 1 - delta


def test_permutation_never_evaluates_more_than_exact() -> None:
    game = TableGame(random_table(5, np.random.default_rng(0)))
    result = PermutationSampling(count=2000, seed=3).run(game)
    assert result.samples == 2000
    assert result.evaluations == game.calls == 2**5


def test_every_permutation_starts_from_the_empty_set() -> None:
    # U(empty) = 10 dwarfs everything else: not resetting U_prev per permutation would credit
    # U(N) - U(empty) only once, to the first player of the first permutation.
    rng = np.random.default_rng(7)
    table = rng.uniform(0.0, 1.0, size=2**5)
    table[0] = 10.0
    truth = exact(table)
    result = PermutationSampling(count=20_000, seed=0).run(TableGame(table))
    assert result.stderr is not None
    assert np.all(np.abs(result.values - truth) <= 5 * result.stderr)
    assert np.max(np.abs(result.values - truth)) <= 0.15
    assert abs(result.efficiency_residual) <= 1e-9
    assert np.max(np.abs(paper_algorithm_2(table, 5, permutations=2000, seed=0) - truth)) > 1.0


def test_marginals_are_credited_to_the_participant_not_the_position() -> None:
    weights = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    table = all_coalitions(5).astype(float) @ weights  # additive: Shapley values = weights
    result = PermutationSampling(count=500, seed=0).run(TableGame(table))
    np.testing.assert_allclose(result.values, weights, atol=1e-12)
    by_position = paper_algorithm_2(table, 5, permutations=500, seed=0, reset=True)
    assert np.max(np.abs(by_position - weights)) > 0.1  # every position averages to mean(weights)


def paper_algorithm_2(
    table: np.ndarray, m: int, permutations: int, seed: int, reset: bool = False
) -> np.ndarray:
    """Algorithm 2 as printed: U_prev never reset (unless reset=True), marginal credited to position i."""
    rng = np.random.default_rng(seed)
    s = np.zeros(m)
    u_prev = table[0]
    for _ in range(permutations):
        order = rng.permutation(m)
        if reset:
            u_prev = table[0]
        mask = 0
        for i in range(m):
            mask |= 1 << int(order[i])
            s[i] += table[mask] - u_prev
            u_prev = table[mask]
    return s / permutations


@pytest.mark.parametrize("m", [2, 3, 7])
def test_group_testing_is_exactly_efficient(m: int) -> None:
    table = random_table(m, np.random.default_rng(m)) + 3.0
    result = GroupTesting(count=37, seed=5).run(TableGame(table))
    assert abs(result.values.sum() - (table[-1] - table[0])) <= 1e-9
    assert result.evaluations <= min(2**m, 37 + 2)


def test_single_player_needs_no_sampling() -> None:
    for estimator in (PermutationSampling(), GroupTesting()):
        result = estimator.run(TableGame(np.array([0.25, 1.0])))
        assert result.values.tolist() == [0.75] and result.evaluations == 2 and result.samples == 0


def test_size_distribution_is_normalized_and_the_papers_is_not() -> None:
    for m in range(2, 30):
        ks, q, z = size_distribution(m)
        assert abs(q.sum() - 1.0) <= 1e-12
        paper_q = (1.0 / ks) * (1.0 / ks + 1.0 / (m - ks))  # Algorithm 3 as printed
        if m > 2:
            assert abs(paper_q.sum() - 1.0) > 1e-3
        # the variance term of the Bernstein budget: sum_k q(k) (k/m)(1 - k/m) = (m-1)/(Z m)
        assert math.isclose(float(np.sum(q * ks / m * (1 - ks / m))), (m - 1) / (z * m), rel_tol=1e-12)


def group_testing_expectation(table: np.ndarray, m: int) -> np.ndarray:
    """E[fedsv's group-testing estimate], by enumerating every subset with its sampling probability."""
    rows = all_coalitions(m)
    sizes = rows.sum(axis=1)
    _, q, z = size_distribution(m)
    inside = (sizes >= 1) & (sizes <= m - 1)
    prob = np.zeros(2**m)
    prob[inside] = q[sizes[inside] - 1] / np.array([math.comb(m, int(k)) for k in sizes[inside]])
    centred = table - table[0]
    y = z * centred[:, None] * (rows - sizes[:, None] / m)
    return (table[-1] - table[0]) / m + prob @ y


def paper_pivot_expectation(table: np.ndarray, m: int) -> np.ndarray:
    """E[Algorithm 4's output] with exact differences: pivot's Banzhaf value + (s_i - s_pivot)."""
    rows = all_coalitions(m)
    pivot = m - 1
    without = ~rows[:, pivot]
    banzhaf = float(np.mean(table[np.flatnonzero(without) | (1 << pivot)] - table[without]))
    shapley = exact(table)
    return banzhaf + (shapley - shapley[pivot])


def test_paper_pivot_is_banzhaf_biased_but_fedsv_group_testing_is_unbiased() -> None:
    m = 4
    unanimity = np.zeros(2**m)
    unanimity[-1] = 1.0  # U(S) = 1 iff S = N: Shapley 1/4 each, Banzhaf 1/8 each
    np.testing.assert_allclose(paper_pivot_expectation(unanimity, m), np.full(m, 1 / 8))
    np.testing.assert_allclose(group_testing_expectation(unanimity, m), np.full(m, 1 / 4), atol=1e-12)

    # noise plus a convex symmetric part (|S|/m)^8: Banzhaf and Shapley values differ
    table = 0.2 * random_table(6, np.random.default_rng(11)) + (all_coalitions(6).sum(axis=1) / 6) ** 8
    truth = exact(table)
    assert np.max(np.abs(paper_pivot_expectation(table, 6) - truth)) > 0.05
    np.testing.assert_allclose(group_testing_expectation(table, 6), truth, atol=1e-12)
    estimate = GroupTesting(count=200_000, seed=0).run(TableGame(table))
    assert np.max(np.abs(estimate.values - truth)) <= 0.02


def test_group_testing_budget_formula() -> None:
    m, eps, delta, r = 10, 0.05, 0.05, 1.0
    z = harmonic_z(m)
    sigma2 = z * r**2 * (m - 1) / m
    expected = math.ceil((2 * sigma2 + 4 / 3 * z * r * eps) / eps**2 * math.log(2 * m / delta))
    assert group_testing_budget(m, eps, delta, r) == expected
    assert group_testing_budget(1, eps, delta, r) == 0
