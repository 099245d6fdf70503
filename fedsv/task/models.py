"""The paper's models as plain nn.Sequential layer lists (valuation finds their linear first layer)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fedsv.task.resnet import ResNet18


class MLP(nn.Sequential):
    """The paper's MNIST MLP: two hidden layers of 200 units with ReLU (flattens its input first)."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), hidden: int = 200, num_classes: int = 10):
        in_features = math.prod(int(d) for d in input_shape)
        super().__init__(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
        self.input_shape = tuple(int(d) for d in input_shape)


class MnistCNN(nn.Sequential):
    """The paper's MNIST CNN: 5x5 conv 10 and 20 with 2x2 max pooling, then 320-50-10 with dropout."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10):
        if tuple(input_shape) != (1, 28, 28):
            raise ValueError(f"MnistCNN expects 1x28x28 images, got {input_shape}")
        super().__init__(
            nn.Conv2d(1, 10, kernel_size=5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(10, 20, kernel_size=5),
            nn.Dropout2d(0.5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(320, 50),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(50, num_classes),
        )
        self.input_shape = (1, 28, 28)


class CifarCNN(nn.Sequential):
    """The paper's CIFAR-10 CNN: 5x5 conv 32 and 64, each with 2x2 max pooling, FC 512, softmax output."""

    def __init__(self, input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10):
        if tuple(input_shape) != (3, 32, 32):
            raise ValueError(f"CifarCNN expects 3x32x32 images, got {input_shape}")
        super().__init__(
            nn.Conv2d(3, 32, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 5 * 5, 512),
            nn.ReLU(),
            nn.Linear(512, num_classes),
        )
        self.input_shape = (3, 32, 32)


MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "cnn_mnist": MnistCNN,
    "cnn_cifar": CifarCNN,
    "resnet18": ResNet18,
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int = 10, seed: int = 0) -> nn.Module:
    """Instantiate a model by name with seeded initial weights; images come in as (n, C, H, W).

    "cnn" picks the CNN that fits the input: MnistCNN for 1x28x28, CifarCNN for 3x32x32.
    """
    key = name.lower()
    if key == "cnn":
        key = "cnn_cifar" if tuple(input_shape) == (3, 32, 32) else "cnn_mnist"
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted([*MODELS, 'cnn'])}")
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = MODELS[key](input_shape=tuple(input_shape), num_classes=num_classes)
    finally:
        torch.random.set_rng_state(generator_state)
    return model
