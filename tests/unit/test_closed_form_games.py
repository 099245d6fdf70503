"""Every estimator against games whose Shapley values are known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from fedsv.valuation import shapley_values
from fedsv.valuation.estimators.spec import ValuationSpec
from tests.support.games import ClosedForm, additive, all_closed_form, table_of

GAMES = all_closed_form()


@pytest.mark.parametrize("name", sorted(GAMES))
def test_exact_matches_closed_form(name: str) -> None:
    utility, m, expected = GAMES[name]
    result = shapley_values(utility, m, spec=ValuationSpec(method="exact"))
    np.testing.assert_allclose(result.values, expected, rtol=0, atol=1e-9)
    assert result.evaluations == 2**m


@pytest.mark.parametrize("method", ["permutation", "group_testing"])
@pytest.mark.parametrize("name", sorted(GAMES))
def test_sampling_within_eps_of_closed_form(name: str, method: str) -> None:
    utility, m, expected = GAMES[name]
    table = table_of(utility, m)
    r = float(table.max() - table.min())  # the guarantee needs max U - min U <= utility_range
    eps = 0.05 * r
    result = shapley_values(
        utility, m, spec=ValuationSpec(method=method, eps=eps, delta=0.05, seed=1, utility_range=r)
    )
    assert result.method == method
    assert np.max(np.abs(result.values - expected)) <= eps
    assert result.evaluations <= 2**m


def test_loo_on_additive_game_is_the_weights() -> None:
    utility, m, weights = additive([0.5, -0.2, 1.3, 0.0, 0.7], offset=-4.0)
    result = shapley_values(utility, m, spec=ValuationSpec(method="loo"))
    np.testing.assert_allclose(result.values, weights, atol=1e-12)
    assert result.evaluations == m + 2  # all, all-but-i for each i, and the empty set
    assert result.utility_empty == -4.0


def test_glove_closed_form_for_one_left_two_right() -> None:
    game: ClosedForm = GAMES["glove_1l_2r"]
    np.testing.assert_allclose(game[2], [2 / 3, 1 / 6, 1 / 6])
