"""Values per validation label: from the same forward passes, and they add up to the participants' values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsv.task.models import build_model
from fedsv.valuation import FederatedValuation, RoundGame, ValuationSpec


def round_game(m: int, metric: str = "accuracy", seed: int = 0) -> RoundGame:
    torch.manual_seed(seed)
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    deltas = [{k: 0.05 * torch.randn_like(v) for k, v in params.items()} for _ in range(m)]
    x, y = torch.rand(200, 1, 28, 28), torch.randint(0, 10, (200,))
    return RoundGame(model, params, deltas, list(range(10, 10 + m)), x, y, metric=metric)


@pytest.mark.parametrize(
    ("m", "spec"),
    [
        (6, ValuationSpec(method="exact")),
        (12, ValuationSpec(method="regression", target_stderr=0.004, seed=3)),
        (9, ValuationSpec(method="kernelshap", budget=150, seed=1)),
        (8, ValuationSpec(method="permutation", budget=120, seed=2)),
    ],
)
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_the_labels_values_add_up_to_each_participants_value(
    m: int, spec: ValuationSpec, metric: str
) -> None:
    game = round_game(m, metric)
    evaluated_before = None
    rv = FederatedValuation().value_round(game, [f"p{i}" for i in range(m)], 1, spec)
    assert rv.classes is not None and rv.classes.values.shape == (m, 10)
    np.testing.assert_allclose(rv.classes.values.sum(axis=1), rv.fedsv, rtol=0, atol=1e-9)
    assert evaluated_before is None and rv.evaluations == game.evaluations  # nothing evaluated for the labels
    assert np.all(rv.classes.stderr >= 0)
    if spec.method == "exact":
        assert np.all(rv.classes.stderr == 0)


def test_a_label_a_participant_damages_shows_up_there() -> None:
    """Participant 0 pushes the model away from label 3 only: its value is negative there, not elsewhere."""
    torch.manual_seed(4)
    model = build_model("mlp", (1, 28, 28), seed=0)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    last = [name for name in params if name.endswith("bias")][-1]
    deltas = [{k: torch.zeros_like(v) for k, v in params.items()} for _ in range(4)]
    for helper in deltas[1:]:
        helper[last][3] = 0.5  # the helpers raise label 3's logit
    deltas[0][last][3] = -4.0  # participant 0 sinks it
    x, y = torch.rand(300, 1, 28, 28), torch.randint(0, 10, (300,))
    game = RoundGame(model, params, deltas, [10] * 4, x, y)
    rv = FederatedValuation().value_round(game, ["bad", "a", "b", "c"], 1, ValuationSpec(method="exact"))
    assert rv.classes is not None
    by_label = rv.classes.values
    assert by_label[0, 3] < 0 and by_label[0, 3] == by_label[0].min()
    assert np.all(by_label[1:, 3] >= -1e-12)  # up to float rounding


def test_gtg_values_are_not_split_by_label() -> None:
    game = round_game(6)
    rv = FederatedValuation().value_round(game, list("abcdef"), 1, ValuationSpec(method="gtg", budget=40))
    assert rv.classes is None
