"""The checkpoint: w_{t+1} and the selection RNG after the last committed round, and its byte codec."""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Checkpoint:
    """The coordinator's state after `round` (the last completed round); only the latest is kept."""

    round: int
    global_params: bytes
    rng_state: str
    extra: str = "{}"  # JSON: what else the round loop carries across rounds (the update guard's memory)


def encode_params(params: dict[str, Tensor]) -> bytes:
    """A model state as the bytes a checkpoint holds (torch's format, tensors only)."""
    buffer = io.BytesIO()
    torch.save(params, buffer)
    return buffer.getvalue()


def decode_params(blob: bytes) -> dict[str, Tensor]:
    """The model state encode_params wrote; ValueError if the bytes hold anything else."""
    loaded = torch.load(io.BytesIO(blob), weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError("checkpoint does not hold a parameter dictionary")
    return loaded
