"""RoundGame on a torch device and in a precision: CPU is today's numbers, CUDA (when present) agrees."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsv.data import load_dataset
from fedsv.fl.state import federated_state
from fedsv.task.models import build_model
from fedsv.valuation import RoundGame
from fedsv.valuation.estimators.exact import all_coalitions
from fedsv.valuation.round import round_game
from fedsv.valuation.round.device import DEFAULT_BUDGET_MB, DEFAULT_WORKING_SET, PRECISIONS
from fedsv.valuation.round.round_game import MODES
from tests.support.round_games import Score, fast_executor, patch_scores

NUM_VAL = 100
M = 4
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

Params = dict[str, Tensor]


@dataclass
class Setup:
    """A float32 round of 4 participants: the model, w_t, the deltas, sample counts, validation data."""

    model: nn.Module
    global_params: Params
    deltas: list[Params]
    counts: list[int]
    x: Tensor
    y: Tensor

    def game(self, **kwargs: Any) -> RoundGame:
        return RoundGame(self.model, self.global_params, self.deltas, self.counts, self.x, self.y, **kwargs)


def _conv_model() -> nn.Module:
    """A small Conv2d stem with a convolutional head (max pooling, a second Conv2d, a Linear)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(1, 4, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 10 * 10, 10),
        )


def _bn_model() -> nn.Module:
    """A Linear stem followed by BatchNorm: float buffers are part of the federated state."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        norm = nn.BatchNorm1d(32)
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), norm, nn.ReLU(), nn.Linear(32, 10))
    assert norm.running_mean is not None and norm.running_var is not None
    norm.running_mean.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(2))
    norm.running_var.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))
    return model


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "mlp": lambda: build_model("mlp", (1, 28, 28), seed=0),
    "conv": _conv_model,
    "bn": _bn_model,
}


@pytest.fixture(scope="module")
def validation() -> tuple[Tensor, Tensor]:
    splits = load_dataset("embedded", seed=0, validation_size=NUM_VAL, test_size=100)
    return torch.from_numpy(splits.validation.x), torch.from_numpy(splits.validation.y)


@pytest.fixture(scope="module")
def setups(validation: tuple[Tensor, Tensor]) -> dict[str, Setup]:
    x, y = validation
    out = {}
    for seed, (name, build) in enumerate(BUILDERS.items()):
        model = build()
        g = {k: v.detach().clone() for k, v in federated_state(model).items()}
        gen = torch.Generator().manual_seed(10 + seed)
        deltas = [
            {
                k: 0.3 * (i + 1) * (float(v.std()) + 1e-3) * torch.randn(v.shape, generator=gen)
                for k, v in g.items()
            }
            for i in range(M)
        ]
        for delta in deltas:  # variances stay positive in every coalition's model
            for k in delta:
                if k.endswith("running_var"):
                    delta[k] = delta[k].abs()
        out[name] = Setup(model, g, deltas, [12, 30, 7, 51], x, y)
    return out


def _snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_untouched(model: nn.Module, before: dict[str, Tensor], training: bool) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].device.type == "cpu", f"{key} moved to {after[key].device}"
        assert torch.equal(after[key], value), f"{key} changed"
    assert model.training is training
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------- CPU: today's numbers


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_cpu_and_auto_are_bit_identical_to_the_default(
    setups: dict[str, Setup], name: str, metric: str
) -> None:
    setup = setups[name]
    members = all_coalitions(M)
    by_mode = {}
    for mode in MODES:
        default = setup.game(metric=metric, mode=mode)
        assert default.device == torch.device("cpu") and default.precision == "fp32"
        assert default.mode == mode
        expected = default.utilities(members)
        assert expected.dtype == np.float64 and expected.shape == (2**M,)
        cpu = setup.game(metric=metric, mode=mode, device="cpu", precision="fp32")
        np.testing.assert_array_equal(cpu.utilities(members), expected)
        cpu_obj = setup.game(metric=metric, mode=mode, device=torch.device("cpu"))
        np.testing.assert_array_equal(cpu_obj.utilities(members), expected)
        auto = setup.game(metric=metric, mode=mode, device="auto")
        assert auto.device.type == ("cuda" if CUDA else "cpu")
        if not CUDA:
            np.testing.assert_array_equal(auto.utilities(members), expected)
        by_mode[mode] = expected
    if metric == "accuracy":
        assert len(set(by_mode["naive"].tolist())) > 1  # not a degenerate game
    for mode in MODES:  # float32: the modes agree up to rounding
        np.testing.assert_allclose(
            by_mode[mode], by_mode["naive"], rtol=0, atol=0.02 if metric == "accuracy" else 1e-4
        )


def test_callable_metric_and_memory_budget_on_cpu(setups: dict[str, Setup]) -> None:
    """A metric callable and a budget below the stem outputs (chunks recomputed) give the same numbers."""
    setup = setups["mlp"]
    members = all_coalitions(M)

    def neg_loss(logits: Tensor, y: Tensor) -> Tensor:
        return -F.cross_entropy(logits, y, reduction="none")

    reference = setup.game(metric="neg_loss").utilities(members)
    for device in ("cpu", "auto"):
        game = setup.game(metric=neg_loss, device=device, memory_budget_mb=1e-4, working_set_floats=2_000)
        np.testing.assert_allclose(game.utilities(members), reference, rtol=0, atol=1e-5)
        assert not fast_executor(game).stems.cached


def test_default_budget_on_cpu(setups: dict[str, Setup]) -> None:
    game = setups["mlp"].game(device="cpu")
    assert game.memory.budget_floats == int(DEFAULT_BUDGET_MB * 2**20 / 4)
    assert game.memory.working_set == DEFAULT_WORKING_SET
    explicit = setups["mlp"].game(device="cpu", memory_budget_mb=64, working_set_floats=4096)
    assert explicit.memory.budget_floats == int(64 * 2**20 / 4) and explicit.memory.working_set == 4096


def test_scores_stay_tensors_until_the_batch_is_done(
    setups: dict[str, Setup], monkeypatch: pytest.MonkeyPatch
) -> None:
    """score_logits hands back float64 tensors on the game's device; only _evaluate makes numpy."""
    setup = setups["mlp"]
    returned: list[Tensor] = []

    def spy(score: Score) -> Score:
        def scored(logits: Tensor, y: Tensor, metric: Any, cells: Tensor, width: int) -> Tensor:
            out = score(logits, y, metric, cells, width)
            returned.append(out)
            return out

        return scored

    patch_scores(monkeypatch, spy)
    for mode in MODES:
        game = setup.game(mode=mode, device="auto")
        values = game._evaluate(all_coalitions(M))
        assert isinstance(values, np.ndarray) and values.dtype == np.float64 and values.shape == (2**M,)
    assert returned
    assert all(isinstance(t, Tensor) and t.dtype == torch.float64 for t in returned)
    assert {t.device.type for t in returned} == {"cuda" if CUDA else "cpu"}


# --------------------------------------------------------------------------- the caller's model


@pytest.mark.parametrize("training", [True, False])
def test_callers_model_is_not_moved_or_modified(setups: dict[str, Setup], training: bool) -> None:
    for name in ("mlp", "conv", "bn"):
        setup = setups[name]
        model = setup.model
        model.train(training)
        before = _snapshot(model)
        try:
            for mode in MODES:
                for precision in PRECISIONS:
                    game = setup.game(mode=mode, device="auto", precision=precision)
                    game.utilities(all_coalitions(M)[::2])
                    _assert_untouched(model, before, training)
        finally:
            model.eval()


def test_a_model_elsewhere_is_copied_not_moved(
    setups: dict[str, Setup], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy path (a model not on the game's device), run on the CPU: same numbers, model untouched."""
    setup = setups["bn"]
    members = all_coalitions(M)
    shared = {mode: setup.game(mode=mode, metric="neg_loss") for mode in MODES}
    assert all(game.model is setup.model for game in shared.values())
    monkeypatch.setattr(round_game, "lives_on", lambda model, device: False)
    setup.model.train(True)
    before = _snapshot(setup.model)
    try:
        for mode in MODES:
            copied = setup.game(mode=mode, metric="neg_loss")
            assert copied.model is not setup.model and not copied.model.training
            np.testing.assert_array_equal(copied.utilities(members), shared[mode].utilities(members))
            _assert_untouched(setup.model, before, training=True)
    finally:
        setup.model.eval()


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("name", ["mlp", "conv", "bn"])
def test_tf32_is_fp32_on_cpu_and_bf16_is_close(setups: dict[str, Setup], name: str) -> None:
    setup = setups[name]
    members = all_coalitions(M)
    for mode in MODES:
        for metric, tolerance in (("accuracy", 0.05), ("neg_loss", 0.02)):
            fp32 = setup.game(metric=metric, mode=mode, device="cpu").utilities(members)
            tf32 = setup.game(metric=metric, mode=mode, device="cpu", precision="tf32")
            assert tf32.precision == "tf32"
            np.testing.assert_array_equal(tf32.utilities(members), fp32)
            bf16 = setup.game(metric=metric, mode=mode, device="cpu", precision="bf16")
            assert bf16.mode == mode
            got = bf16.utilities(members)
            assert got.dtype == np.float64 and np.all(np.isfinite(got))
            np.testing.assert_allclose(got, fp32, rtol=0, atol=tolerance)
            if metric == "neg_loss":
                assert not np.array_equal(got, fp32), "bf16 had no effect"


def test_bf16_logits_are_scored_in_float32(setups: dict[str, Setup], monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric callable sees float32 logits under bf16, though the head ran in bfloat16."""
    seen: list[torch.dtype] = []
    raw: list[torch.dtype] = []

    def spy(score: Score) -> Score:
        def scored(logits: Tensor, y: Tensor, metric: Any, cells: Tensor, width: int) -> Tensor:
            raw.append(logits.dtype)
            return score(logits, y, metric, cells, width)

        return scored

    def metric(logits: Tensor, y: Tensor) -> Tensor:
        seen.append(logits.dtype)
        return (logits.argmax(dim=1) == y).double()

    patch_scores(monkeypatch, spy)
    setups["mlp"].game(metric=metric, precision="bf16").utilities(all_coalitions(M))
    assert torch.bfloat16 in raw and set(seen) == {torch.float32}


def test_precision_leaves_global_flags_alone_on_cpu(setups: dict[str, Setup]) -> None:
    def flags() -> tuple[bool, bool, bool]:
        return (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.is_autocast_enabled("cpu"),
        )

    outside = flags()
    inside: list[tuple[bool, bool, bool]] = []

    def metric(logits: Tensor, y: Tensor) -> Tensor:
        inside.append(flags())
        return (logits.argmax(dim=1) == y).double()

    for precision in PRECISIONS:
        setups["mlp"].game(metric=metric, device="cpu", precision=precision).utility(0b1011)
    assert inside == [outside] * len(PRECISIONS)  # metrics run outside autocast, TF32 flags untouched
    assert flags() == outside


# --------------------------------------------------------------------------- bad arguments


def test_bad_device_or_precision_raises_one_line_value_error(setups: dict[str, Setup]) -> None:
    setup = setups["mlp"]
    bad_devices: list[Any] = ["tpu", "gpu", "", "cuda:x", "mps", "meta", 3.5, None]
    bad_devices.append("cuda:99" if CUDA else "cuda")
    if not CUDA:
        bad_devices += ["cuda:0", "cuda:99", torch.device("cuda")]
    for device in bad_devices:
        with pytest.raises(ValueError, match="device") as caught:
            setup.game(device=device)
        assert "\n" not in str(caught.value)
    for precision in ("fp16", "FP32", "float32", "", "bfloat16"):
        with pytest.raises(ValueError, match="unknown precision") as caught:
            setup.game(precision=precision)
        assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="memory_budget_mb"):
        setup.game(memory_budget_mb=float("nan"))


# --------------------------------------------------------------------------- CUDA


@needs_cuda
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
@pytest.mark.parametrize("name", ["mlp", "conv", "bn"])
def test_cuda_fp32_matches_cpu(setups: dict[str, Setup], name: str, metric: str) -> None:
    setup = setups[name]
    members = all_coalitions(M)
    before, training = _snapshot(setup.model), setup.model.training  # as the module's fixture left it
    for mode in MODES:
        expected = setup.game(metric=metric, mode=mode, device="cpu").utilities(members)
        for device in ("cuda", f"cuda:{torch.cuda.current_device()}", "auto"):
            game = setup.game(metric=metric, mode=mode, device=device)
            assert game.device.type == "cuda" and game.mode == mode
            got = game.utilities(members)
            assert isinstance(got, np.ndarray) and got.dtype == np.float64
            # float32 kernels differ between the CPU and CUDA: a mean log-likelihood moves in its 6th digit
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 if metric == "accuracy" else 1e-5)
    _assert_untouched(setup.model, before, training)


@needs_cuda
def test_cuda_inputs_live_on_the_gpu(setups: dict[str, Setup]) -> None:
    setup = setups["mlp"]
    game = setup.game(device="cuda")
    inputs = game.inputs
    tensors = [
        inputs.x_val,
        inputs.y_val,
        inputs.weights,
        *inputs.global_params.values(),
        *(inputs.delta_matrix(name) for name in inputs.names),
    ]
    assert all(t.device == game.device for t in tensors)
    assert all(t.device == game.device for t in game.model.parameters())
    assert game.model is not setup.model
    assert all(p.device.type == "cpu" for p in setup.model.parameters())
    assert game.memory.budget_floats > 0 and game.memory.working_set >= DEFAULT_WORKING_SET
    game.utilities(all_coalitions(M))
    assert all(p.device.type == "cpu" for p in setup.model.parameters())
    # A model already on the GPU is used in place, not copied.
    gpu_model = build_model("mlp", (1, 28, 28), seed=0).cuda()
    in_place = RoundGame(
        gpu_model, setup.global_params, setup.deltas, setup.counts, setup.x, setup.y, device="cuda"
    )
    assert in_place.model is gpu_model


@needs_cuda
@pytest.mark.parametrize("name", ["mlp", "conv", "bn"])
def test_cuda_precisions(setups: dict[str, Setup], name: str) -> None:
    setup = setups[name]
    members = all_coalitions(M)
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    outside = (matmul.allow_tf32, cudnn.allow_tf32)
    for precision in PRECISIONS:
        inside: list[tuple[bool, bool]] = []

        def metric(logits: Tensor, y: Tensor, log: list[tuple[bool, bool]] = inside) -> Tensor:
            log.append((matmul.allow_tf32, cudnn.allow_tf32))
            return (logits.argmax(dim=1) == y).double()

        for mode in MODES:
            reference = setup.game(mode=mode, device="cpu").utilities(members)
            game = setup.game(mode=mode, device="cuda", precision=precision)
            got = game.utilities(members)
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, reference, rtol=0, atol=1e-6 if precision == "fp32" else 0.05)
            setup.game(metric=metric, mode=mode, device="cuda", precision=precision).utility(0b0110)
        allow = precision == "tf32"
        assert set(inside) == {(allow, allow)}  # fp32 and bf16 switch TF32 off, tf32 on
        assert (matmul.allow_tf32, cudnn.allow_tf32) == outside
