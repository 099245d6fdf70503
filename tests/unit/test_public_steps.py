"""The guard's mimic screen (fl.public_steps): an update that carries nothing beyond the global model's
recent steps, or nothing but noise beyond them, is turned away; honest members' real SGD updates, from
much data or little, IID or each holding two classes, never are."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsv.data.corruptions import parse_corruption
from fedsv.fl.aggregation import aggregate
from fedsv.fl.evaluation import EvalSet
from fedsv.fl.public_steps import PublicSteps, mimicked
from fedsv.fl.referee import ValidationReferee
from fedsv.fl.state import params_of
from fedsv.fl.update_bounds import NormBound
from fedsv.fl.update_guard import GuardMemory, GuardSettings, guard_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.task.training import TrainConfig, local_update

CLASSES, FEATURES = 4, 24


def _data(rng: np.random.Generator, n: int, classes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(99).normal(size=(CLASSES, FEATURES))
    y = rng.choice(classes, size=n)
    return (centers[y] + rng.normal(scale=1.5, size=(n, FEATURES))).astype(np.float32), y.astype(np.int64)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def _federation(skewed: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Eight members: 200 samples each but two with 15 (little data); each of two classes if skewed."""
    rng = np.random.default_rng(1)
    sizes = [200, 200, 200, 15, 200, 200, 15, 200]
    return [
        _data(rng, n, [k % CLASSES, (k + 1) % CLASSES] if skewed else list(range(CLASSES)))
        for k, n in enumerate(sizes)
    ]


def _validation() -> EvalSet:
    return EvalSet(*_data(np.random.default_rng(7), 300, list(range(CLASSES))))


def _honest_updates(
    members: list[tuple[np.ndarray, np.ndarray]], model: nn.Module, params: dict[str, torch.Tensor], t: int
) -> list[ClientUpdate]:
    """Round t's real SGD updates of every honest member from w_t = params."""
    config = TrainConfig(epochs=2, batch_size=10, lr=0.05)
    return [
        ClientUpdate(f"p{k}", local_update(model, params, x, y, config, seed=100 * t + k), len(y))
        for k, (x, y) in enumerate(members)
    ]


@pytest.mark.parametrize("skewed", [False, True])
@pytest.mark.parametrize("rider", ["mimic", "mimic:1", "mimic:3", "noise at the honest norm", None])
def test_a_mimic_is_turned_away_and_honest_members_never_are(skewed: bool, rider: str | None) -> None:
    members, model, validation = _federation(skewed), _model(), _validation()
    params, memory = params_of(model), GuardMemory()
    corruption = parse_corruption("mimic" if rider is None else rider.replace(" at the honest norm", ":1"))
    caught: list[int] = []
    for t in range(1, 9):
        updates = _honest_updates(members, model, params, t)
        if rider is not None:
            if rider.startswith("noise"):
                norm = float(np.median([float(u.delta["0.weight"].norm()) for u in updates]))
                sent = parse_corruption(f"noise:{norm}").send(dict(updates[0].delta), seed=t)
            else:
                sent = corruption.send(dict(updates[0].delta), t, params, t)
            updates.append(ClientUpdate("p999", sent, 200))
        referee = ValidationReferee(model, params, validation)
        guarded = guard_updates(updates, NormBound(), GuardSettings(), memory, [200] * 9, referee, params)
        assert set(guarded.mimic) <= {"p999"}, (t, guarded.mimic)  # never an honest member
        assert set(guarded.null) <= {"p999"}, t  # (the direction check is test_update_guard's)
        if "p999" in guarded.mimic or "p999" in guarded.null or "p999" in guarded.bounded.rejected:
            caught.append(t)
        params = aggregate(params, guarded.updates, t)
    if rider is not None:  # every round (a mimic's first update is a zero, null; noise is noise from round 1)
        assert caught == list(range(1, 9)), caught


def test_the_steps_span_a_mimics_step_from_any_of_the_kept_rounds_and_forget_older_ones() -> None:
    public = PublicSteps(keep=3)
    models = [{"w": torch.full((5,), float(t * t)), "b": torch.full((2,), float(t))} for t in range(6)]
    for w in models:
        public.observe(w)
    assert len(public.steps) == 3 and public.names == ["b", "w"]
    assert public.rank == 2  # every step lies in a plane: (1, 2t+1) over b, w
    step = {k: (models[5][k] - models[2][k]) / 3 for k in ("w", "b")}
    flat = public.flat(step)
    assert float((flat - public.along(flat)).norm()) < 1e-9 * float(flat.norm())
    other = torch.arange(7, dtype=torch.float64)
    assert float(public.along(other) @ (other - public.along(other))) == pytest.approx(0.0, abs=1e-9)
    public.observe({"w": torch.zeros(5)})  # another model: the steps start again
    assert public.rank == 0 and mimicked([ClientUpdate("p0", step, 1)], public, step) == {}


def test_a_model_gone_non_finite_or_a_failing_eigensolver_stops_no_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    public = PublicSteps()
    for t in range(3):
        public.observe({"w": torch.arange(4, dtype=torch.float32) * t})
    assert len(public.steps) == 2
    public.observe({"w": torch.tensor([1.0, float("inf"), 0.0, 0.0])})  # a diverged model: no step
    assert len(public.steps) == 0 and public.along(torch.ones(4, dtype=torch.float64)).abs().sum() == 0
    for t in range(3):
        public.observe({"w": torch.arange(4, dtype=torch.float32) * (t + 5)})
    pinv = torch.linalg.pinv

    def failing(a: torch.Tensor, *args: object, hermitian: bool = False, **kw: object) -> torch.Tensor:
        if hermitian:  # as eigh fails on an ill-conditioned Gram matrix
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return pinv(a, *args, **kw)

    monkeypatch.setattr(torch.linalg, "pinv", failing)
    v = torch.arange(4, dtype=torch.float64)
    assert torch.allclose(public.along(v), v)  # the SVD's pseudo-inverse: v lies along the steps


@pytest.mark.parametrize("skewed", [False, True])
@pytest.mark.parametrize("rider", ["mimic", "mimic:1", None])
def test_with_the_screens_off_a_mimic_is_kept_but_marked_public(skewed: bool, rider: str | None) -> None:
    """`--no-update-direction`: nothing is turned away for its direction or as a free rider, but an update
    holding nothing beyond the recent steps (or nothing at all: a mimic's first) is marked public, so the
    round's game holds it in every coalition and pays it nothing; an honest member's never is."""
    members, model, validation = _federation(skewed), _model(), _validation()
    params, memory = params_of(model), GuardMemory()
    corruption = parse_corruption(rider or "mimic")
    marked: list[int] = []
    for t in range(1, 9):
        updates = _honest_updates(members, model, params, t)
        if rider is not None:
            updates.append(ClientUpdate("p999", corruption.send(dict(updates[0].delta), t, params, t), 200))
        referee = ValidationReferee(model, params, validation)
        off = GuardSettings(direction=False)
        guarded = guard_updates(updates, NormBound(), off, memory, [200] * 9, referee, params)
        assert not (guarded.mimic or guarded.null or guarded.turned_away or guarded.worse), t
        public = {u.participant for u in guarded.updates if u.public}
        assert public == set(guarded.public) <= {"p999"}, (t, guarded.public)  # never an honest member
        if "p999" in public:
            marked.append(t)
        elif rider is not None:  # not kept (over the norm bound, or quarantined): else it is marked
            assert "p999" in guarded.bounded.rejected or "p999" in guarded.held, t
        params = aggregate(params, guarded.updates, t)
    if rider is not None:
        assert len(marked) >= 6, marked


def test_an_update_along_the_validation_descent_is_not_noise_though_it_spreads_over_units_as_noise() -> None:
    """The noise test asks two things of an update's part beyond the steps, and both must find noise: no
    more related to the descent and the round's others than noise is, and spread over the units as noise
    spreads. A Gaussian direction passes the second; sent along the validation descent it fails the
    first and is kept, while the same step plus Gaussian noise of that size is turned away."""
    torch.manual_seed(0)
    shapes = {"w": (16, 32), "b": (16,)}
    public = PublicSteps()
    step = {k: torch.randn(s) for k, s in shapes.items()}
    public.observe({k: torch.zeros(s) for k, s in shapes.items()})
    public.observe(step)  # the global model's one step so far: w_1 - w_0
    descent = {k: torch.randn(s) for k, s in shapes.items()}  # spreads over the units as noise does
    rows = torch.zeros(16, 1)
    rows[:3] = 1.0  # an update that moved three neurons only: nothing like noise
    trained = ClientUpdate("p0", {"w": rows * torch.randn(16, 32), "b": torch.zeros(16)}, 100)
    along = ClientUpdate("p1", {k: 0.5 * step[k] + descent[k] for k in shapes}, 100)
    noise = ClientUpdate("p2", {k: 0.5 * step[k] + torch.randn(s) for k, s in shapes.items()}, 100)
    assert public.isotropic(public.flat(descent)) and not public.isotropic(public.flat(trained.delta))
    assert set(mimicked([trained, along, noise], public, descent)) == {"p2"}
