"""The task interface: naming a task, its defaults, its data as Samples, its own training, its errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedsv.data.sources import DataError, Samples
from fedsv.fl.state import params_of
from fedsv.task.interface import LoadedTask, Task, TaskError, TrainContext, as_samples, load_task

TASK_FILE = '''
import numpy as np
from torch import nn
from fedsv.task import Task

class Tiny(Task):
    label = "y"
    def build_model(self):
        return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

task = Tiny()

class Pairs:
    """Not a Task subclass: any object with the attributes will do."""
    def build_model(self):
        return nn.Linear(3, 2)
    def load_local(self, path):
        rng = np.random.default_rng(len(path))
        return rng.normal(size=(12, 3)), rng.integers(0, 2, size=12)
    def load_validation(self, path):
        return self.load_local(path)

pairs = Pairs()
no_model = object()
'''


@pytest.fixture()
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_task.py"
    path.write_text(TASK_FILE)
    return path


def test_a_task_file_outside_the_package_loads_by_path_and_by_module(task_file: Path) -> None:
    by_path = load_task(f"{task_file}:task")
    assert isinstance(by_path.obj, Task) and by_path.metric == "accuracy"
    model = by_path.build_model(seed=3)
    again = by_path.build_model(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    sys.path.insert(0, str(task_file.parent))
    try:
        by_module = load_task("my_task:pairs")
    finally:
        sys.path.remove(str(task_file.parent))
    samples = by_module.local_data("anything")
    assert samples.x.shape == (12, 3) and samples.x.dtype == np.float32 and samples.y.dtype == np.int64


def test_the_built_in_paper_tasks() -> None:
    task = load_task("fedsv.tasks:mnist_mlp")
    model = task.build_model(seed=0)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nomodule_zz:x", "no module named 'nomodule_zz'"),
        ("fedsv.tasks:missing", "has no attribute 'missing'"),
        ("{file}:no_model", "has no build_model, load_local, load_validation"),
        ("{file}:nothing_here", "has no attribute 'nothing_here'"),
        ("/no/such/file.py:task", "no such file"),
        (":x", "expected MODULE:ATTRIBUTE"),
    ],
)
def test_bad_task_strings_get_one_line_errors(spec: str, message: str, task_file: Path) -> None:
    with pytest.raises(TaskError) as info:
        load_task(spec.format(file=task_file))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_bad_metric_is_refused_when_the_task_loads(task_file: Path) -> None:
    task_file.write_text(TASK_FILE + "\ntask.metric = 'f1'\n")
    with pytest.raises(TaskError, match="metric must be one of"):
        load_task(f"{task_file}:task")


def test_loaders_may_return_pairs_tensors_or_datasets() -> None:
    x, y = torch.randn(5, 2), torch.tensor([0, 1, 1, 0, 1])
    for data in ((x, y), [x.numpy(), y.numpy()], TensorDataset(x, y), (x.numpy(), y.numpy().astype(float))):
        samples = as_samples(data, "src")
        np.testing.assert_array_equal(samples.x, x.numpy())
        np.testing.assert_array_equal(samples.y, y.numpy())
    for bad, message in (("text", "must return"), ((x, torch.tensor([0.5] * 5)), "labels must be integers")):
        with pytest.raises(DataError, match=message):
            as_samples(bad, "src")


class OwnTraining(Task):
    def build_model(self) -> nn.Module:
        return nn.Linear(2, 2)

    def train(self, model: nn.Module, data: Samples, context: TrainContext) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(float(context.round))  # a visible step: the delta is the round number


def test_a_task_s_own_training_gives_the_delta_of_its_model() -> None:
    task = LoadedTask("own", OwnTraining())
    model = task.build_model(seed=0)
    start = params_of(model)
    samples = Samples(np.zeros((4, 2), np.float32), np.zeros(4, np.int64), "s")
    context = TrainContext(round=3, rank=0, seed=1, epochs=1, batch_size=2, lr=0.1)
    delta = task.local_update(model, start, samples, context)
    assert set(delta) == set(start)
    assert all(torch.allclose(d, torch.full_like(d, 3.0)) for d in delta.values())


def test_loader_failures_name_the_task_and_the_path(task_file: Path) -> None:
    task = load_task(f"{task_file}:task")
    with pytest.raises(DataError, match="no such file"):
        task.local_data(str(task_file.parent / "absent.csv"))


MODULE_TASK = """
import numpy as np
from torch import nn

def build_model():
    return nn.Linear(2, 2)

def load_local(path):
    return np.zeros((3, 2), np.float32), np.array([0, 1, 1])

load_validation = load_local
"""


def test_a_module_can_itself_be_the_task(tmp_path: Path) -> None:
    (tmp_path / "module_task.py").write_text(MODULE_TASK)
    sys.path.insert(0, str(tmp_path))
    try:
        task = load_task("module_task")  # no attribute: the module is the task
    finally:
        sys.path.remove(str(tmp_path))
    assert task.metric == "accuracy" and len(task.validation_data("v")) == 3
    assert len(task.test_data("t")) == 3  # no load_test: the validation loader reads test data


def _rank_delta(device: str) -> dict[str, torch.Tensor]:
    """One round of local training of rank 0 of a simulated run, on `device`."""
    from fedsv.participant.local import LocalRank, LocalSettings
    from fedsv.settings.run_spec import from_run_spec
    from fedsv.wire.v1 import fedsv_pb2

    train = fedsv_pb2.TrainSettings(epochs=1, batch_size=10, lr=0.05)
    spec = fedsv_pb2.RunSpec(world_size=20, seed=3, dataset="embedded", partition="iid", model="mlp",
                             validation_size=1000, test_size=1000, train=train)  # fmt: skip
    run = from_run_spec(spec)
    local = LocalRank.prepare(0, run, LocalSettings(task="", data="", data_dir="", device=device), None, None)
    params = params_of(load_task("fedsv.tasks:mnist_mlp").build_model(seed=3))
    return local.train(params, fedsv_pb2.RoundTask(round=1, train_seed=11), run)


def test_a_participant_s_device_keeps_cpu_results_and_sends_host_tensors() -> None:
    cpu = _rank_delta("cpu")
    assert all(t.device.type == "cpu" for t in cpu.values())
    assert all(
        torch.equal(cpu[k], v)
        for k, v in _rank_delta("auto" if not torch.cuda.is_available() else "cpu").items()
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_participant_trains_on_cuda_and_sends_host_tensors() -> None:
    cpu, gpu = _rank_delta("cpu"), _rank_delta("cuda")
    assert all(t.device.type == "cpu" for t in gpu.values())
    assert all(torch.allclose(cpu[k], gpu[k], atol=1e-4) for k in cpu)
