"""Which torch device a participant trains on or a round game computes on: "auto", "cpu", "cuda[:N]"."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device) -> torch.device:
    """The device a game computes on: "auto" (CUDA when available, else the CPU), "cpu", "cuda", "cuda:N"."""
    if isinstance(device, str) and device.strip().lower() == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    choices = "use 'auto', 'cpu', 'cuda' or 'cuda:N'"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {device!r}; {choices}") from None
    if resolved.type == "cpu":
        return torch.device("cpu")
    if resolved.type != "cuda":
        raise ValueError(f"unsupported device {device!r}; {choices}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available to this torch; {choices}")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if resolved.index is None else resolved.index
    if not 0 <= index < count:
        raise ValueError(f"device {device!r} asked for, but this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)
