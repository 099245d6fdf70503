"""Distances between a round's deltas (each tensor's rows: one delta per member)."""

from __future__ import annotations

import torch
from torch import Tensor


def pairwise_distances(matrices: list[Tensor]) -> Tensor:
    """Squared L2 distances (m, m) between the deltas whose tensors are the rows of `matrices`."""
    m = matrices[0].shape[0]
    total = torch.zeros((m, m), dtype=torch.float64, device=matrices[0].device)
    for matrix in matrices:
        rows = matrix.to(torch.float64)
        total += torch.cdist(rows, rows).pow(2)
    return total
