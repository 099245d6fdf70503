"""Robust aggregation rules: the coordinator's aggregate and every coalition of the round game agree."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from fedsv.fl.aggregation import RULES, AggregationRule, aggregate, pairwise_distances
from fedsv.fl.evaluation import evaluate
from fedsv.fl.updates import ClientUpdate
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import all_coalitions


def _rows(m: int) -> torch.Tensor:
    return torch.from_numpy(all_coalitions(m))


def test_coordinatewise_rules_match_numpy_on_every_coalition() -> None:
    rng = np.random.default_rng(0)
    matrix = torch.tensor(rng.normal(size=(6, 7)))
    rows = _rows(6)
    median = AggregationRule("median").combine(rows, matrix)
    trimmed = AggregationRule("trimmed_mean", trim=0.2).combine(rows, matrix)
    assert torch.all(median[0] == 0) and torch.all(trimmed[0] == 0)  # the empty coalition: w_t
    for b in range(1, rows.shape[0]):
        x = matrix[rows[b]].numpy()
        np.testing.assert_allclose(median[b].numpy(), np.median(x, axis=0), atol=1e-12)
        cut = int(np.floor(0.2 * x.shape[0]))
        np.testing.assert_allclose(
            trimmed[b].numpy(), np.sort(x, axis=0)[cut : x.shape[0] - cut].mean(0), atol=1e-12
        )


def _krum_reference(matrix: np.ndarray, members: list[int], f: int) -> list[int]:
    """Krum's scores as Flower computes them: the sum of squared distances to the n - f - 2 closest."""
    closest = max(1, len(members) - f - 2)
    scores = []
    for i in members:
        d = sorted(float(((matrix[i] - matrix[j]) ** 2).sum()) for j in members if j != i)
        scores.append(sum(d[:closest]))
    return [members[k] for k in np.argsort(scores, kind="stable")]


@pytest.mark.parametrize(("name", "keep"), [("krum", 0), ("multi_krum", 0), ("multi_krum", 2)])
def test_krum_selects_as_the_reference_in_every_coalition(name: str, keep: int) -> None:
    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(6, 5))
    matrix[4] *= 30  # an outlier
    counts = torch.tensor(rng.integers(1, 9, size=6).astype(float))
    rule = AggregationRule(name, byzantine=1, keep=keep)
    coeffs = rule.coefficients(_rows(6), counts, pairwise_distances([torch.tensor(matrix)]))
    for b, row in enumerate(_rows(6)):
        members = [i for i in range(6) if row[i]]
        if not members:
            assert torch.all(coeffs[b] == 0)
            continue
        ranked = _krum_reference(matrix, members, 1)
        n_keep = 1 if name == "krum" else (min(keep, len(members)) if keep else max(1, len(members) - 1))
        chosen = sorted(ranked[:n_keep])
        assert [i for i in range(6) if coeffs[b, i] > 0] == chosen
        expected = counts[chosen] / counts[chosen].sum()
        np.testing.assert_allclose(coeffs[b, chosen].numpy(), expected.numpy(), atol=1e-12)


def _round(
    m: int = 5,
) -> tuple[nn.Module, dict[str, torch.Tensor], list[ClientUpdate], torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    updates = [
        ClientUpdate(f"p{i:03d}", {k: 0.3 * torch.randn_like(v) for k, v in params.items()}, 10 + 5 * i)
        for i in range(m)
    ]
    updates[3] = ClientUpdate("p003", {k: 40.0 * v for k, v in updates[3].delta.items()}, 10)  # an attacker
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    return model, params, updates, x, y


@pytest.mark.parametrize("name", RULES)
def test_the_game_of_every_rule_scores_the_coordinators_aggregate(name: str) -> None:
    model, params, updates, x, y = _round()
    rule = AggregationRule(name, trim=0.2)
    deltas, counts = [u.delta for u in updates], [u.num_samples for u in updates]
    modes = {}
    for mode in ("fast", "batched", "naive"):
        game = RoundGame(model, params, deltas, counts, x, y, aggregation=rule, mode=mode)
        modes[game.mode] = game.utilities(all_coalitions(5))
    assert ("fast" in modes) == (not rule.coordinatewise)
    reference = modes.pop("naive")
    for values in modes.values():
        np.testing.assert_allclose(values, reference, atol=1e-9)
    # U(all players) is the accuracy of the model the coordinator aggregates with the same rule
    accuracy, _ = evaluate(model, aggregate(params, updates, 1, rule), x, y)
    assert reference[-1] == pytest.approx(accuracy, abs=1e-9)


def test_bad_rules_name_the_setting() -> None:
    cases = [
        ({"name": "mean"}, "aggregation must be one of"),
        ({"trim": 0.5}, "aggregation_trim"),
        ({"byzantine": -1}, "aggregation_byzantine"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            AggregationRule(**kwargs)  # type: ignore[arg-type]
    assert list(itertools.islice(RULES, 1)) == ["fedavg"]
