"""RoundGame: the fast, batched and naive modes agree with each other and with a hand-built FedAvg model."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsv.data import load_dataset
from fedsv.fl.evaluation import evaluate
from fedsv.fl.state import apply_delta, fedavg, load_params, params_of
from fedsv.task.models import build_model
from fedsv.task.training import TrainConfig, local_update
from fedsv.valuation import RoundGame, shapley_values
from fedsv.valuation.estimators.exact import all_coalitions
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.round.round_game import MODES
from tests.support.round_games import Score, fast_executor, patch_scores

NUM_VAL = 40
"""Validation samples per game: a few dozen keeps the naive reference cheap."""

Params = dict[str, Tensor]


@dataclass
class Round:
    """One round's inputs in float64: the model, w_t, the deltas, sample counts and validation data."""

    name: str
    input_shape: tuple[int, int, int]
    model: nn.Module
    global_params: Params
    deltas: list[Params]
    counts: list[int]
    x: Tensor
    y: Tensor
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def m(self) -> int:
        return len(self.deltas)

    def game(self, **kwargs: Any) -> RoundGame:
        return RoundGame(self.model, self.global_params, self.deltas, self.counts, self.x, self.y, **kwargs)


@pytest.fixture(scope="module")
def embedded() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    splits = load_dataset("embedded", seed=0, validation_size=NUM_VAL, test_size=100)
    return splits.train.x, splits.train.y, splits.validation.x, splits.validation.y


def _random_deltas(global_params: Params, m: int, seed: int, step: float) -> list[Params]:
    """Deltas of realistic size: participant i moves each tensor by step * (i + 1) of its spread."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(m):
        scale = step * (1 + i)
        out.append(
            {
                k: scale * (float(v.std()) + 1e-3) * torch.randn(v.shape, generator=gen, dtype=v.dtype)
                for k, v in global_params.items()
            }
        )
    return out


def _mlp_round(data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> Round:
    """MLP with real deltas: a few SGD steps of local_update (float32) per participant, then float64."""
    x_tr, y_tr, x_val, y_val = data
    model = build_model("mlp", (1, 28, 28), seed=1)
    start = params_of(model)
    counts = [12, 20, 28, 36, 44, 60]  # unequal on purpose
    deltas, offset = [], 0
    for i, n in enumerate(counts):
        xs, ys = x_tr[offset : offset + n], y_tr[offset : offset + n]
        offset += n
        deltas.append(local_update(model, start, xs, ys, TrainConfig(batch_size=8, lr=0.1), seed=i))
    model = build_model("mlp", (1, 28, 28), seed=1).double()
    return Round(
        "mlp",
        (1, 28, 28),
        model,
        {k: v.double() for k, v in start.items()},
        [{k: v.double() for k, v in d.items()} for d in deltas],
        counts,
        torch.from_numpy(x_val).double(),
        torch.from_numpy(y_val),
    )


def _random_round(
    name: str, input_shape: tuple[int, int, int], m: int, seed: int, step: float, x: Tensor, y: Tensor
) -> Round:
    model = build_model(name, input_shape, seed=seed).double()
    global_params = params_of(model)
    counts = [int(c) for c in np.random.default_rng(seed).integers(5, 80, size=m)]
    deltas = _random_deltas(global_params, m, seed, step)
    return Round(name, input_shape, model, global_params, deltas, counts, x, y)


@pytest.fixture(scope="module")
def rounds(embedded: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> dict[str, Round]:
    x_val, y_val = torch.from_numpy(embedded[2]).double(), torch.from_numpy(embedded[3])
    gen = torch.Generator().manual_seed(3)
    x_cifar = torch.randn((NUM_VAL, 3, 32, 32), generator=gen, dtype=torch.float64)  # normalized images
    y_cifar = torch.randint(0, 10, (NUM_VAL,), generator=gen)
    return {
        "mlp": _mlp_round(embedded),
        "cnn_mnist": _random_round("cnn_mnist", (1, 28, 28), 5, 2, 0.02, x_val, y_val),
        # random labels on noise: larger steps so that the coalitions' predictions differ
        "cnn_cifar": _random_round("cnn_cifar", (3, 32, 32), 4, 3, 0.1, x_cifar, y_cifar),
    }


MODEL_NAMES = ["mlp", "cnn_mnist", "cnn_cifar"]


def _hand_utility(
    rnd: Round, coalition: list[int], metric: str, aggregation: str = "fedavg", server_lr: float = 1.0
) -> float:
    """U(S) built by hand: w_t + server_lr * weighted mean of S's deltas, loaded into a fresh model."""
    weights = [float(rnd.counts[i]) if aggregation == "fedavg" else 1.0 for i in coalition]
    params = {}
    for name, base in rnd.global_params.items():
        update = torch.zeros_like(base)
        for i, w in zip(coalition, weights, strict=True):
            update += w * rnd.deltas[i][name]
        params[name] = base + server_lr * update / sum(weights) if coalition else base.clone()
    fresh = build_model(rnd.name, rnd.input_shape, seed=99).double()
    load_params(fresh, params)
    fresh.eval()
    with torch.no_grad():
        logits = fresh(rnd.x)
    if metric == "accuracy":
        return float((logits.argmax(dim=1) == rnd.y).double().mean())
    return -float(F.cross_entropy(logits, rnd.y))


def _assert_same(a: np.ndarray, b: np.ndarray, metric: str) -> None:
    if metric == "accuracy":
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- modes agree


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_all_coalitions_identical_across_modes(rounds: dict[str, Round], name: str, metric: str) -> None:
    rnd = rounds[name]
    members = all_coalitions(rnd.m)
    utilities = {}
    for mode in MODES:
        game = rnd.game(metric=metric, mode=mode)
        assert game.mode == mode  # the three paper models all have a linear stem: no silent fallback
        utilities[mode] = game.utilities(members)
        assert game.evaluations == 2**rnd.m
    assert np.all(np.isfinite(utilities["naive"]))
    if metric == "accuracy":
        # not a degenerate game: the coalitions do not all score the same
        assert len(set(utilities["naive"].tolist())) > 1
    _assert_same(utilities["fast"], utilities["naive"], metric)
    _assert_same(utilities["batched"], utilities["naive"], metric)


@pytest.mark.parametrize(("aggregation", "server_lr"), [("fedavg", 1.0), ("fedavg", 0.7), ("uniform", 1.5)])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_matches_hand_computation(
    rounds: dict[str, Round], name: str, aggregation: str, server_lr: float
) -> None:
    rnd = rounds[name]
    coalitions = [[], [0], [rnd.m - 1], [0, 2], list(range(1, rnd.m)), list(range(rnd.m))]
    rows = np.zeros((len(coalitions), rnd.m), dtype=bool)
    for r, coalition in enumerate(coalitions):
        rows[r, coalition] = True
    for metric in ("accuracy", "neg_loss"):
        expected = np.array([_hand_utility(rnd, c, metric, aggregation, server_lr) for c in coalitions])
        for mode in MODES:
            game = rnd.game(metric=metric, mode=mode, aggregation=aggregation, server_lr=server_lr)
            _assert_same(game.utilities(rows), expected, metric)


def test_fedavg_weighting_is_not_uniform(rounds: dict[str, Round]) -> None:
    """Unequal sample counts make FedAvg and uniform aggregation differ (so the tests above can tell)."""
    rnd = rounds["mlp"]
    pair = np.zeros((1, rnd.m), dtype=bool)
    pair[0, [0, rnd.m - 1]] = True
    fedavg_u = rnd.game(metric="neg_loss", aggregation="fedavg").utilities(pair)[0]
    uniform_u = rnd.game(metric="neg_loss", aggregation="uniform").utilities(pair)[0]
    assert abs(fedavg_u - uniform_u) > 1e-6
    assert fedavg_u == pytest.approx(_hand_utility(rnd, [0, rnd.m - 1], "neg_loss"), abs=1e-10)


def test_empty_coalition_is_the_global_model(rounds: dict[str, Round]) -> None:
    rnd = rounds["cnn_mnist"]
    model = build_model("cnn_mnist", (1, 28, 28), seed=5).double()
    load_params(model, rnd.global_params)
    model.eval()
    with torch.no_grad():
        expected = -float(F.cross_entropy(model(rnd.x), rnd.y))
    for mode in MODES:
        assert rnd.game(metric="neg_loss", mode=mode, server_lr=3.0).utility(0) == pytest.approx(
            expected, abs=1e-12
        )


# --------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_chunked_path_equals_cached_path(rounds: dict[str, Round], name: str) -> None:
    rnd = rounds[name]
    members = all_coalitions(rnd.m)
    for metric in ("accuracy", "neg_loss"):
        cached = rnd.game(metric=metric)
        expected = cached.utilities(members)
        assert fast_executor(cached).stems.cached
        # A budget far below the stem outputs' size (and a tiny working set for matmul heads): the stem
        # outputs are recomputed chunk by chunk on every call and never cached.
        chunked = rnd.game(metric=metric, memory_budget_mb=1e-4, working_set_floats=2_000)
        first = chunked.utilities(members[: len(members) // 2])
        second = chunked.utilities(members[len(members) // 2 :])
        assert not fast_executor(chunked).stems.cached
        _assert_same(np.concatenate([first, second]), expected, metric)


def test_chunked_path_holds_one_chunk_at_a_time(
    rounds: dict[str, Round], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the memory budget, each chunk's stem outputs are consumed before the next chunk's are computed."""
    rnd = rounds["mlp"]
    game = rnd.game(memory_budget_mb=1e-4, working_set_floats=2_000)
    events: list[str] = []
    stems = fast_executor(game).stems
    stem_outputs = stems.compute_chunk

    def logged_stem(x: Tensor) -> tuple[Tensor, Tensor]:
        events.append("stem")
        return stem_outputs(x)

    def logged(score: Score) -> Score:
        def logged_score(logits: Tensor, y: Tensor, metric: object, cells: Tensor, width: int) -> Tensor:
            events.append("score")
            return score(logits, y, metric, cells, width)

        return logged_score

    monkeypatch.setattr(stems, "compute_chunk", logged_stem)
    patch_scores(monkeypatch, logged)
    game.utilities(all_coalitions(rnd.m))
    chunks = events.count("stem")
    assert chunks > 2
    # stem, score..., stem, score..., ...: never two chunks' stem outputs alive at once
    assert all(a != b or a == "score" for a, b in itertools.pairwise(events)) and events[0] == "stem"


# --------------------------------------------------------------------------- Shapley values


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_exact_values_are_group_rational(rounds: dict[str, Round], name: str, metric: str) -> None:
    rnd = rounds[name]
    game = rnd.game(metric=metric)
    result = shapley_values(game, spec=ValuationSpec(method="exact"))
    assert result.method == "exact" and result.evaluations == 2**rnd.m
    # U(all) is the metric of the model the coordinator builds: w_t + FedAvg of all deltas.
    aggregated = apply_delta(rnd.global_params, fedavg(rnd.deltas, rnd.counts))
    coordinator_model = build_model(rnd.name, rnd.input_shape, seed=7).double()
    load_params(coordinator_model, aggregated)
    coordinator_model.eval()
    with torch.no_grad():
        logits = coordinator_model(rnd.x)
    if metric == "accuracy":
        u_all = float((logits.argmax(dim=1) == rnd.y).double().mean())
        assert result.utility_grand == u_all
    else:
        u_all = -float(F.cross_entropy(logits, rnd.y))
        assert result.utility_grand == pytest.approx(u_all, abs=1e-10)
    assert math.isclose(float(np.sum(result.values)), u_all - result.utility_empty, rel_tol=0, abs_tol=1e-9)
    assert abs(result.efficiency_residual) <= 1e-9


def test_grand_coalition_matches_float32_coordinator(
    embedded: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """In float32 (the coordinator's dtype) U(all) matches training.evaluate on the FedAvg model."""
    x_tr, y_tr, x_val, y_val = embedded
    model = build_model("mlp", (1, 28, 28), seed=4)
    start = params_of(model)
    counts = [16, 24, 40]
    deltas = [
        local_update(
            model, start, x_tr[40 * i : 40 * i + n], y_tr[40 * i : 40 * i + n], TrainConfig(), seed=i
        )
        for i, n in enumerate(counts)
    ]
    aggregated = apply_delta(start, fedavg(deltas, counts))
    accuracy, loss = evaluate(model, aggregated, x_val, y_val)
    for mode in MODES:
        acc_game = RoundGame(model, start, deltas, counts, x_val, y_val, mode=mode)
        loss_game = RoundGame(model, start, deltas, counts, x_val, y_val, mode=mode, metric="neg_loss")
        assert acc_game.empty_and_grand()[1] == pytest.approx(accuracy, abs=1e-12)
        assert loss_game.empty_and_grand()[1] == pytest.approx(-loss, abs=1e-5)


# --------------------------------------------------------------------------- memoization


def test_memoized_coalitions_are_not_evaluated_again(
    rounds: dict[str, Round], monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = rounds["mlp"]
    game = rnd.game()
    calls: list[int] = []
    inner: Callable[[np.ndarray], np.ndarray] = game._evaluate

    def counting(members: np.ndarray) -> np.ndarray:
        calls.append(int(members.shape[0]))
        return inner(members)

    monkeypatch.setattr(game, "_evaluate", counting)
    forwards: list[int] = []
    hooks = [layer.register_forward_hook(lambda *_: forwards.append(1)) for layer in rnd.model.children()]
    try:
        members = all_coalitions(rnd.m)
        first = game.utilities(members[:20])
        assert calls == [20] and game.evaluations == 20
        seen_forwards = len(forwards)
        assert seen_forwards > 0
        again = game.utilities(members[:20][::-1])
        np.testing.assert_array_equal(again, first[::-1])
        assert calls == [20] and game.evaluations == 20 and len(forwards) == seen_forwards
        # Overlapping batches evaluate only the new coalitions; exact Shapley then costs the rest only.
        game.utilities(members[10:30])
        assert calls == [20, 10] and game.evaluations == 30
        result = shapley_values(game, spec=ValuationSpec(method="exact"))
        assert result.evaluations == 2**rnd.m - 30 and calls[-1] == 2**rnd.m - 30
        before = len(calls)
        again_result = shapley_values(game, spec=ValuationSpec(method="exact"))
        assert again_result.evaluations == 0 and len(calls) == before
        np.testing.assert_array_equal(again_result.values, result.values)
    finally:
        for hook in hooks:
            hook.remove()


# --------------------------------------------------------------------------- bad input


def _with(params: Mapping[str, Tensor], changes: Mapping[str, Tensor | None]) -> Params:
    out = {k: v.clone() for k, v in params.items()}
    for name, value in changes.items():
        if value is None:
            del out[name]
        else:
            out[name] = value
    return out


def test_bad_inputs_raise_clear_errors(rounds: dict[str, Round]) -> None:
    rnd = rounds["mlp"]
    g, d, counts, x, y = rnd.global_params, rnd.deltas, rnd.counts, rnd.x, rnd.y
    model = rnd.model
    assert [k for k, _ in model.named_parameters()][:2] == ["1.weight", "1.bias"]  # the first Linear
    nan = _with(d[0], {})
    nan["1.weight"][3, 5] = float("nan")
    inf = _with(d[0], {})
    inf["5.bias"][0] = float("inf")
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: RoundGame(model, g, [], [], x, y), "empty round"),
        (lambda: RoundGame(model, g, [_with(d[0], {"5.bias": None}), *d[1:]], counts, x, y), "missing"),
        (
            lambda: RoundGame(
                model, g, [_with(d[0], {"extra.weight": torch.zeros(2)}), *d[1:]], counts, x, y
            ),
            "unexpected",
        ),
        (lambda: RoundGame(model, _with(g, {"1.bias": None}), d, counts, x, y), "global model.*missing"),
        (
            lambda: RoundGame(model, g, [*d[:-1], _with(d[-1], {"1.bias": torch.zeros(7)})], counts, x, y),
            r"delta 5: 1\.bias has shape \(7,\)",
        ),
        (lambda: RoundGame(model, g, [nan, *d[1:]], counts, x, y), "non-finite"),
        (lambda: RoundGame(model, g, [*d[:2], inf, *d[3:]], counts, x, y), "delta 2.*non-finite"),
        (lambda: RoundGame(model, g, d, counts[:-1], x, y), "sample counts for"),
        (lambda: RoundGame(model, g, d, [0, *counts[1:]], x, y), "positive"),
        (lambda: RoundGame(model, g, d, [-3, *counts[1:]], x, y), "positive"),
        (lambda: RoundGame(model, g, d, [float("nan"), *counts[1:]], x, y), "positive"),
        (lambda: RoundGame(model, g, d, counts, x, y[:-1]), "matching non-empty x and y"),
        (lambda: RoundGame(model, g, d, counts, x[:0], y[:0]), "matching non-empty x and y"),
        (lambda: RoundGame(model, g, d, counts, x, y, metric="f1"), "unknown metric 'f1'"),
        (lambda: RoundGame(model, g, d, counts, x, y, aggregation="geo"), "unknown aggregation 'geo'"),
        (lambda: RoundGame(model, g, d, counts, x, y, mode="turbo"), "unknown mode 'turbo'"),
        (lambda: RoundGame(model, g, d, counts, x, y, server_lr=0.0), "server_lr"),
        (lambda: RoundGame(model, g, d, counts, x, y, server_lr=-1.0), "server_lr"),
        (lambda: RoundGame(model, g, d, counts, x, y, server_lr=float("inf")), "server_lr"),
        (lambda: RoundGame(model, g, d, counts, x, y, memory_budget_mb=0), "memory_budget_mb"),
    ]
    for build, message in cases:
        with pytest.raises(ValueError, match=message):
            build()

    game = rnd.game()
    for kwargs, message in [
        ({"eps": 0.0}, "eps"),
        ({"eps": -0.1}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": 1.5}, "delta"),
        ({"method": "exact", "max_exact_players": 5}, "too large for exact"),
        ({"method": "shapley"}, "unknown method"),
    ]:
        with pytest.raises(ValueError, match=message):
            shapley_values(game, spec=ValuationSpec(**kwargs))  # type: ignore[arg-type]
    assert game.evaluations == 0  # nothing was evaluated for a rejected request
    many = RoundGame(model, g, [d[i % rnd.m] for i in range(21)], [1] * 21, x, y)
    with pytest.raises(ValueError, match="m=21 too large for exact"):
        shapley_values(many, spec=ValuationSpec(method="exact"))
    assert many.evaluations == 0


# --------------------------------------------------------------------------- inputs left alone


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_and_inputs_are_not_modified(rounds: dict[str, Round], name: str) -> None:
    rnd = rounds[name]
    model = rnd.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    deltas_before = [{k: v.clone() for k, v in d.items()} for d in rnd.deltas]
    global_before = {k: v.clone() for k, v in rnd.global_params.items()}
    members = all_coalitions(rnd.m)
    for training in (True, False):
        model.train(training)
        for mode in MODES:
            for metric in ("accuracy", "neg_loss"):
                rnd.game(metric=metric, mode=mode, memory_budget_mb=1e-4).utilities(members[::3])
            assert model.training is training
            after = model.state_dict()
            assert after.keys() == before.keys()
            for key, value in before.items():
                assert torch.equal(after[key], value), f"{mode} changed {key}"
            assert all(p.grad is None for p in model.parameters())
    model.eval()
    for d, saved in zip(rnd.deltas, deltas_before, strict=True):
        assert all(torch.equal(d[k], saved[k]) for k in saved)
    assert all(torch.equal(rnd.global_params[k], global_before[k]) for k in global_before)


def test_grouped_conv_stem_falls_back_to_batched() -> None:
    """A grouped first convolution cannot use the stacked-delta stem: the game picks mode='batched'."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Unflatten(1, (2, 8, 8)),
        nn.Conv2d(2, 4, 3, groups=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 3),
    ).double()
    g = params_of(model)
    deltas = [{k: 0.3 * torch.randn_like(v) for k, v in g.items()} for _ in range(3)]
    x, y = torch.randn(30, 2 * 8 * 8, dtype=torch.float64), torch.randint(0, 3, (30,))
    fast = RoundGame(model, g, deltas, [1, 2, 3], x, y, mode="fast", metric="neg_loss")
    naive = RoundGame(model, g, deltas, [1, 2, 3], x, y, mode="naive", metric="neg_loss")
    assert fast.mode == "batched"
    members = all_coalitions(3)
    np.testing.assert_allclose(fast.utilities(members), naive.utilities(members), rtol=0, atol=1e-10)
    # The same layers with groups=1 take the fast path, through the Unflatten.
    model[1] = nn.Conv2d(2, 4, 3).double()
    g = params_of(model)
    deltas = [{k: 0.3 * torch.randn_like(v) for k, v in g.items()} for _ in range(3)]
    fast = RoundGame(model, g, deltas, [1, 2, 3], x, y, mode="fast", metric="neg_loss")
    naive = RoundGame(model, g, deltas, [1, 2, 3], x, y, mode="naive", metric="neg_loss")
    assert fast.mode == "fast"
    np.testing.assert_allclose(fast.utilities(members), naive.utilities(members), rtol=0, atol=1e-10)
