"""Redundant members valued as one player: the merged game, its values split, and what is redundant."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fedsv.app.demo import DemoConfig, run_demo
from fedsv.data import load_dataset
from fedsv.fl.aggregation import AggregationRule, aggregate
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.redundancy import counted_once, delta_matrices, redundant_groups, relative_distances
from fedsv.fl.state import params_of
from fedsv.fl.updates import ClientUpdate
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation import FederatedValuation, RoundGame
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.games.game import CallableGame
from fedsv.valuation.games.merged_game import MergedGame, check_groups
from fedsv.valuation.round_valuation import GameSettings, value_updates


def brute_shapley(utility: object, m: int) -> np.ndarray:
    """Shapley values by every permutation (m <= 6)."""
    values = np.zeros(m)
    orders = list(itertools.permutations(range(m)))
    for order in orders:
        before: frozenset[int] = frozenset()
        for player in order:
            values[player] += utility(before | {player}) - utility(before)  # type: ignore[operator]
            before = before | {player}
    return values / len(orders)


def test_a_merged_game_is_the_game_of_its_groups() -> None:
    weights = np.array([0.3, 0.1, 0.5, 0.2, 0.4])

    def utility(s: frozenset[int]) -> float:  # submodular: a copy adds less than it would alone
        return float(np.sqrt(sum(weights[i] for i in s)))

    groups = [[0, 3], [1], [2, 4]]
    merged = MergedGame(CallableGame(utility, 5), [[3, 0], [1], [4, 2]])
    assert merged.groups == groups and merged.m == 3

    def of_groups(s: frozenset[int]) -> float:
        return utility(frozenset(i for g in s for i in groups[g]))

    values = FederatedValuation().value_round(
        CallableGame(utility, 5), list("abcde"), 1, ValuationSpec(method="exact"), groups=groups
    )
    per_group = brute_shapley(of_groups, 3)
    expected = np.array([per_group[0], per_group[1], per_group[2], per_group[0], per_group[2]])
    expected[[0, 3, 2, 4]] /= 2
    np.testing.assert_allclose(values.fedsv, expected, atol=1e-12)
    assert values.group_rationality_residual == pytest.approx(0.0, abs=1e-12)
    assert "a and d valued as one player" in values.choice and "c and e" in values.choice
    exact = ValuationSpec(method="exact")
    alone = FederatedValuation().value_round(CallableGame(utility, 5), list("abcde"), 1, exact)
    np.testing.assert_allclose(alone.fedsv, brute_shapley(utility, 5), atol=1e-12)
    assert "one player" not in alone.choice


def test_groups_must_partition_the_players() -> None:
    for bad in ([[0, 1]], [[0, 1], [1, 2]], [[0], [1], [2], [3]], [[0, 1, 2], []]):
        with pytest.raises(ValueError, match="partition"):
            check_groups(bad, 3)
    for bad in ([[0], [1], [2]], [[0]], []):  # player 1 is in every coalition: the others, once each
        with pytest.raises(ValueError, match="partition"):
            check_groups(bad, 3, always=[1])


def test_a_public_member_is_in_every_coalition_and_valued_zero() -> None:
    """A member whose update holds nothing beyond what the coordinator broadcast (public) is in every
    coalition, the empty one too: its value is 0, each other member's is its Shapley value in the game
    that always holds the public member, and the round splits U(all) - U({public}), with or without
    merged groups among the others."""
    weights = np.array([0.3, 0.1, 0.5, 0.2, 0.4])

    def utility(s: frozenset[int]) -> float:
        return float(np.sqrt(sum(weights[i] for i in s)) - 0.2 * (2 in s) * (4 in s))

    def with_public(s: frozenset[int]) -> float:  # players 0, 1, 3, 4 of the game that always holds 2
        return utility(frozenset([0, 1, 3, 4][i] for i in s) | {2})

    exact = ValuationSpec(method="exact")
    values = FederatedValuation().value_round(CallableGame(utility, 5), list("abcde"), 1, exact, public=[2])
    expected = np.insert(brute_shapley(with_public, 4), 2, 0.0)
    np.testing.assert_allclose(values.fedsv, expected, atol=1e-12)
    assert values.fedsv[2] == 0.0 and values.loo[2] == 0.0 and values.public == ["c"]
    assert values.utility_before == pytest.approx(utility(frozenset({2})))
    assert values.fedsv.sum() == pytest.approx(utility(frozenset(range(5))) - utility(frozenset({2})))
    assert "c in every coalition, valued 0" in values.choice
    merged = FederatedValuation().value_round(
        CallableGame(utility, 5), list("abcde"), 1, exact, groups=[[0, 3], [1], [4]], public=[2]
    )

    def groups_with_public(s: frozenset[int]) -> float:
        return utility(frozenset(i for g in s for i in ([0, 3], [1], [4])[g]) | {2})

    per_group = brute_shapley(groups_with_public, 3)
    expected = np.array([per_group[0] / 2, per_group[1], 0.0, per_group[0] / 2, per_group[2]])
    np.testing.assert_allclose(merged.fedsv, expected, atol=1e-12)
    assert merged.public == ["c"] and merged.merged == [["a", "d"]]


@dataclass(frozen=True)
class MnistRound:
    """A really trained round: its game, its members' deltas and the validation set the game scores on."""

    game: RoundGame
    deltas: list[dict[str, torch.Tensor]]
    validation: EvalSet


def _mnist_round(copies: dict[int, int], halves: dict[int, int] | None = None) -> MnistRound:
    """Six members of 40 embedded MNIST images each, really trained; copies: member -> whose images;
    halves: member -> whose first 20 images it holds beside its own last 20."""
    splits = load_dataset("embedded", seed=0, validation_size=160, test_size=100)
    x, y = splits.train.x, splits.train.y
    model = build_model("mlp", (1, 28, 28), seed=1)
    start = params_of(model)
    deltas = []
    for i in range(6):
        owner = copies.get(i, i)
        held = np.arange(40 * owner, 40 * owner + 40)
        if halves and i in halves:
            held = np.concatenate([np.arange(40 * halves[i], 40 * halves[i] + 20), held[20:]])
        xs, ys = x[held], y[held]
        deltas.append(local_update(model, start, xs, ys, TrainConfig(batch_size=8, lr=0.1, epochs=2), seed=i))
    val_x, val_y = splits.validation.x, splits.validation.y
    game = RoundGame(model, start, deltas, [40] * 6, val_x, val_y, metric="neg_loss")
    return MnistRound(game, deltas, EvalSet(val_x, val_y))


def test_redundant_members_weigh_as_one_member_in_the_round_and_in_its_game() -> None:
    """AggregationRule(once=True): the copy and its original share one member's weight in the round's
    aggregate, and every coalition of the round's game is aggregated the same way (its U(all) is the
    score of the model the round made)."""
    trained = _mnist_round({5: 2})
    game, deltas, validation = trained.game, trained.deltas, trained.validation
    weights = [40.0, 40.0, 20.0, 40.0, 40.0, 20.0]
    assert counted_once(deltas, [40.0] * 6) == weights
    updates = [ClientUpdate(f"p{i}", delta, 40) for i, delta in enumerate(deltas)]
    start = game.inputs.global_params
    once = aggregate(start, updates, 1, AggregationRule(once=True))
    expected = {
        n: start[n] + sum(w * d[n] for w, d in zip(weights, deltas, strict=True)) / 200 for n in start
    }
    assert all(torch.allclose(once[n], expected[n], atol=1e-6) for n in start)
    twice = aggregate(start, updates, 1, AggregationRule())
    assert not all(torch.allclose(once[n], twice[n], atol=1e-6) for n in start)
    spec = ValuationSpec(method="exact", merge_redundant=True)
    settings = GameSettings(metric="neg_loss", aggregation=AggregationRule(once=True))
    rv = value_updates(game.model, start, updates, validation, 1, spec, FederatedValuation(), settings)
    step = [{n: once[n] - start[n] for n in start}]  # the round's model as one member's update
    made = RoundGame(game.model, start, step, [1], validation.x, validation.y, metric="neg_loss")
    assert rv.utility_after == pytest.approx(float(made.utilities(np.array([[True]]))[0]), abs=1e-6)
    assert rv.merged == [["p2", "p5"]] and rv.fedsv[2] == rv.fedsv[5]


def test_a_copy_is_redundant_and_members_with_data_of_their_own_are_not() -> None:
    trained = _mnist_round({5: 2})
    game, deltas = trained.game, trained.deltas
    relative = relative_distances(delta_matrices(deltas))
    pairs = np.triu_indices(6, 1)
    assert relative[2, 5] < 0.15 * np.median(relative[pairs])  # the copy, shuffled otherwise
    groups = redundant_groups(delta_matrices(deltas))
    assert groups == [[0], [1], [2, 5], [3], [4]]
    assert redundant_groups(delta_matrices(_mnist_round({}).deltas)) == [[i] for i in range(6)]
    # the hard case: a member holding half of another's images has data of its own, and is not merged
    # (its distance is 0.38 of the median here, the copy's 0.04: the threshold, 0.15, lies between)
    assert redundant_groups(delta_matrices(_mnist_round({}, halves={5: 2}).deltas)) == [[i] for i in range(6)]
    assert redundant_groups(delta_matrices(deltas[:2])) == [[0], [1]]  # two members: nothing to compare with
    inputs = game.inputs  # the game's own stacked deltas give the same groups
    assert redundant_groups(list(inputs.delta_matrices.values())) == groups
    ids = [f"p{i}" for i in range(6)]
    apart = FederatedValuation().value_round(game, ids, 1, ValuationSpec(method="exact"))
    merged = FederatedValuation().value_round(game, ids, 1, ValuationSpec(method="exact"), groups=groups)
    assert merged.fedsv[2] == merged.fedsv[5] and merged.loo[2] == merged.loo[5]
    assert merged.classes is not None and np.allclose(merged.classes.values.sum(axis=1), merged.fedsv)
    # the owner's two identities share what one player is worth, not twice what each is worth apart
    assert merged.fedsv[2] + merged.fedsv[5] < 0.6 * (apart.fedsv[2] + apart.fedsv[5])
    assert merged.group_rationality_residual == pytest.approx(0.0, abs=1e-12)


NEG_LOSS = GameSettings(metric="neg_loss")  # as _mnist_round's game


def test_with_merging_off_look_alike_members_are_valued_apart_and_named() -> None:
    """The round's valuation with merging off (the default): the copy and its original are each their own
    player, and the round names them alike; members with data of their own are never named."""
    spec = ValuationSpec(method="exact")
    for copies, alike in (({5: 2}, [["p2", "p5"]]), ({}, [])):
        trained = _mnist_round(copies)
        start = trained.game.inputs.global_params
        updates = [ClientUpdate(f"p{i}", delta, 40) for i, delta in enumerate(trained.deltas)]
        rv = value_updates(
            trained.game.model, start, updates, trained.validation, 1, spec, FederatedValuation(), NEG_LOSS
        )
        assert rv.alike == alike and rv.merged == []
        assert ("alike, valued apart" in rv.choice) == bool(alike), rv.choice
        apart = FederatedValuation().value_round(trained.game, [u.participant for u in updates], 1, spec)
        assert np.allclose(rv.fedsv, apart.fedsv)  # named, and valued exactly as before


def test_a_run_that_merges_pays_an_owner_who_joins_twice_as_one_player() -> None:
    settings = dict(participants=6, rounds=3, fraction=1.0, seed=0, valuation="exact", corrupt="5=copy:2")
    merged = run_demo(DemoConfig(**settings, valuation_merge_redundant=True)).valuation  # type: ignore[arg-type]
    for values in merged.per_round():
        assert "p002 and p005 valued as one player" in values.choice, values.choice
        assert values.fedsv[2] == values.fedsv[5]
    apart = run_demo(DemoConfig(**settings)).valuation  # type: ignore[arg-type]
    assert not any("one player" in values.choice for values in apart.per_round())
    assert all(values.alike == [["p002", "p005"]] for values in apart.per_round())  # named, valued apart
    assert all(values.alike == [] for values in merged.per_round())
    twice = {
        how: sum(v.fedsv[2] + v.fedsv[5] for v in run.per_round())
        for how, run in (("m", merged), ("a", apart))
    }
    assert twice["m"] < 0.75 * twice["a"]
    # one owner for the whole run (tests/unit/test_owners.py: pooled before the completion and shrinkage)
    assert merged.owners().shared() == [["p002", "p005"]] and not apart.owners().pooled
