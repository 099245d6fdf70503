"""The paper's setups as tasks: its MLP and CNNs on MNIST-shaped or CIFAR-10-shaped images."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedsv.data.sources import read_data
from fedsv.task.interface import Task
from fedsv.task.models import build_model

INPUT_SHAPES: dict[str, tuple[int, int, int]] = {
    "embedded": (1, 28, 28),
    "mnist": (1, 28, 28),
    "fashion_mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
}


@dataclass(frozen=True)
class PaperTask(Task):
    """One of the paper's models on images of `input_shape` in 10 classes.

    Data: any standard source (an .npz of images, an image folder, IDX files, CIFAR-10 batches) or
    the simulation, "simulated:DATASET", which the runtime resolves itself (a rank's shard, or the
    run's validation and test splits).
    """

    model: str = "mlp"
    input_shape: tuple[int, int, int] = (1, 28, 28)
    num_classes: int = 10
    metric: str = "accuracy"  # the utility: "accuracy" or "neg_loss" (mean log-likelihood)

    def build_model(self) -> nn.Module:
        # The runtime seeds the RNG before build_model(); building with that seed gives the same
        # initial weights as fedsv.task.models.build_model(..., seed=run seed).
        return build_model(self.model, self.input_shape, self.num_classes, seed=torch.initial_seed())

    def load_local(self, path: str) -> object:
        return read_data(path)

    def load_validation(self, path: str) -> object:
        return read_data(path)

    def load_test(self, path: str) -> object:
        return read_data(path)


def paper_task(model: str, dataset: str, metric: str = "accuracy") -> PaperTask:
    """The built-in task of a run that names no --task: `model` sized for `dataset`'s images."""
    key = dataset.lower().replace("-", "_")
    if key not in INPUT_SHAPES:
        raise ValueError(f"unknown data set {dataset!r}; choose one of {sorted(INPUT_SHAPES)}")
    return PaperTask(model=model, input_shape=INPUT_SHAPES[key], metric=metric)


mnist_mlp = PaperTask("mlp", (1, 28, 28))
mnist_cnn = PaperTask("cnn_mnist", (1, 28, 28))
cifar_cnn = PaperTask("cnn_cifar", (3, 32, 32))
