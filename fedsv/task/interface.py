"""The task interface: what a federation trains, how each side loads its own data, how values are measured."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from fedsv.data.sources import DataError, Samples, read_data
from fedsv.fl.state import load_params, params_of
from fedsv.task.training import TrainConfig, local_update

METRICS = ("accuracy", "neg_loss")
REQUIRED = ("build_model", "load_local", "load_validation")


class TaskError(ValueError):
    """A task that cannot be loaded or used; the message is one line naming the task and the problem."""


@dataclass(frozen=True)
class TrainContext:
    """What a task's own train(model, data, context) gets besides the model and its data.

    seed: this rank's seed in this round (the same seed must give the same delta); the run's local
    training settings (epochs, batch_size, lr, momentum, weight_decay) as the coordinator sent them.
    """

    round: int
    rank: int
    seed: int
    epochs: int
    batch_size: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    @property
    def sgd(self) -> TrainConfig:
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )


class Task:
    """Base class of a task; subclass it and define build_model (the loaders have defaults).

    The default loaders read the standard data sources (fedsv.data.sources.read_data): a .npz
    with x and y, a CSV/TSV/Parquet table with label column `label`, an image folder, MNIST IDX files
    or a CIFAR-10 batch. Define `train(model, data, context)` to replace the default seeded SGD, and
    set `metric` ("accuracy", "neg_loss" or a callable (logits, y) -> per-sample scores).
    """

    label: str | None = None
    classes: Sequence[str] | None = None
    metric: str | Callable[[Tensor, Tensor], Tensor] = "accuracy"

    def build_model(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define build_model()")

    def load_local(self, path: str) -> Any:
        return read_data(path, label=self.label, classes=self.classes)

    def load_validation(self, path: str) -> Any:
        return read_data(path, label=self.label, classes=self.classes)

    def load_test(self, path: str) -> Any:
        return read_data(path, label=self.label, classes=self.classes)


def as_samples(data: Any, name: str) -> Samples:
    """What a loader returned, as Samples: a pair (x, y) of arrays or tensors, a Dataset of (x, y)."""
    if isinstance(data, Samples):
        return data
    if isinstance(data, tuple | list) and len(data) == 2:
        x, y = data
    elif isinstance(data, Dataset):
        try:
            items = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
        except TypeError as exc:
            raise DataError(f"{name}: a Dataset must have a length and (x, y) items: {exc}") from exc
        if not items:
            raise DataError(f"{name}: the Dataset is empty")
        x = torch.stack([torch.as_tensor(item[0]) for item in items])
        y = torch.as_tensor([int(item[1]) for item in items])
    else:
        raise DataError(f"{name}: a loader must return (x, y) or a torch Dataset, got {type(data).__name__}")
    x_np = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
    y_np = y.detach().cpu().numpy() if isinstance(y, Tensor) else np.asarray(y)
    whole = np.issubdtype(y_np.dtype, np.floating) and bool(np.all(np.mod(y_np, 1) == 0))
    if not np.issubdtype(y_np.dtype, np.integer) and not whole:
        raise DataError(f"{name}: labels must be integers 0..K-1, got dtype {y_np.dtype}")
    try:
        features = x_np.astype(np.float32)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: features must be numeric: {exc}") from exc
    return Samples(x=features, y=y_np.astype(np.int64), name=name)


def _import_object(spec: str) -> Any:
    """The object `spec` names: "package.module:attribute", "package.module" or "file.py:attribute"."""
    target, _, attribute = spec.partition(":")
    if not target:
        raise TaskError(f"task {spec!r}: expected MODULE:ATTRIBUTE, MODULE or FILE.py:ATTRIBUTE")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise TaskError(f"task {spec!r}: no such file {target}")
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        module_name = f"fedsv_task_{path.stem}_{digest}"
        module = sys.modules.get(module_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise TaskError(f"task {spec!r}: cannot load {target} as Python")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[module_name]
                raise TaskError(f"task {spec!r}: {target} failed to import: {_describe(exc)}") from exc
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: a task module in the working directory
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise TaskError(f"task {spec!r}: no module named {exc.name!r}") from exc
        except Exception as exc:
            raise TaskError(f"task {spec!r}: module {target} failed to import: {_describe(exc)}") from exc
    obj: Any = module
    for part in filter(None, attribute.split(".")):
        if not hasattr(obj, part):
            raise TaskError(f"task {spec!r}: {target} has no attribute {part!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise TaskError(f"task {spec!r}: cannot instantiate {obj.__name__}(): {exc}") from exc
    return obj


def _describe(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@dataclass(frozen=True)
class LoadedTask:
    """A task as the runtime uses it: its spec string, the object, and the defaults it leaves out."""

    spec: str
    obj: Any

    @property
    def metric(self) -> str | Callable[[Tensor, Tensor], Tensor]:
        metric = getattr(self.obj, "metric", "accuracy")
        if callable(metric) or metric in METRICS:
            return metric
        raise TaskError(
            f"task {self.spec!r}: metric must be one of {list(METRICS)} or a callable, got {metric!r}"
        )

    def build_model(self, seed: int) -> nn.Module:
        """The task's model, its initial weights seeded (the coordinator's w_0)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.obj.build_model()
        if not isinstance(model, nn.Module):
            raise TaskError(
                f"task {self.spec!r}: build_model() returned {type(model).__name__}, not an nn.Module"
            )
        if not any(True for _ in model.parameters()):
            raise TaskError(f"task {self.spec!r}: build_model() returned a model without parameters")
        return model

    def _load(self, method: str, path: str) -> Samples:
        loader = getattr(self.obj, method, None)
        if loader is None:
            raise TaskError(f"task {self.spec!r} has no {method}(path)")
        try:
            data = loader(path)
        except (DataError, TaskError):
            raise
        except FileNotFoundError as exc:
            raise DataError(f"{path}: no such file or folder ({exc.strerror or exc})") from exc
        except Exception as exc:
            raise TaskError(f"task {self.spec!r}: {method}({path!r}) failed: {_describe(exc)}") from exc
        return as_samples(data, path)

    def local_data(self, path: str) -> Samples:
        return self._load("load_local", path)

    def validation_data(self, path: str) -> Samples:
        return self._load("load_validation", path)

    def test_data(self, path: str) -> Samples:
        return self._load("load_test" if hasattr(self.obj, "load_test") else "load_validation", path)

    def local_update(
        self,
        model: nn.Module,
        global_state: Mapping[str, Tensor],
        samples: Samples,
        context: TrainContext,
        corruption: Any = None,
    ) -> dict[str, Tensor]:
        """Train from w_t on the rank's samples; the delta (trained - w_t) of the model's state.

        The task's own train(model, data, context) if it has one (the model arrives holding w_t),
        otherwise seeded SGD with the run's settings (and the simulation's backdoor, if any).
        """
        if getattr(corruption, "trains", True):
            delta = self._train(model, global_state, samples, context, corruption)
        else:  # a simulated free rider: no training, its update of the delta's shape
            delta = {name: torch.zeros_like(t) for name, t in global_state.items()}
        send = getattr(corruption, "send", None)
        return send(delta, context.seed, global_state, context.round) if send is not None else delta

    def _train(
        self,
        model: nn.Module,
        global_state: Mapping[str, Tensor],
        samples: Samples,
        context: TrainContext,
        corruption: Any,
    ) -> dict[str, Tensor]:
        train = getattr(self.obj, "train", None)
        if train is None:
            return local_update(
                model, global_state, samples.x, samples.y, context.sgd, context.seed, corruption
            )
        load_params(model, global_state)
        device = next(model.parameters()).device
        cuda: list[int] = []
        if device.type == "cuda":
            cuda = [device.index if device.index is not None else torch.cuda.current_device()]
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(context.seed)  # every device's generator: dropout on a GPU too
            train(model, samples, context)
        trained = params_of(model)
        return {
            name: trained[name].to(global_state[name].device) - global_state[name] for name in global_state
        }


def load_task(spec: str) -> LoadedTask:
    """Import the task `spec` names and check it has build_model, load_local and load_validation."""
    obj = _import_object(spec.strip())
    missing = [name for name in REQUIRED if not callable(getattr(obj, name, None))]
    if missing:
        raise TaskError(f"task {spec!r}: {type(obj).__name__} has no {', '.join(missing)}")
    train = getattr(obj, "train", None)
    if train is not None and not callable(train):
        raise TaskError(f"task {spec!r}: train must be callable")
    task = LoadedTask(spec.strip(), obj)
    task.metric  # noqa: B018 - validates the metric now, not in round 1
    return task
