"""Checks that a data set fits the model before any round: features the model takes, labels it can predict."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsv.data.samples import DataError, Samples

PROBE = 4
"""Samples pushed through the model to check that the features fit it."""


def check_fits(model: nn.Module, samples: Samples, role: str) -> None:
    """DataError (one line naming the data) unless the model takes the samples' features and, for a
    classifier (outputs of shape (n, classes)), every label is one of its classes.

    A few samples go through the model in eval mode without gradients, on the model's device; its
    mode is restored. This catches a table with the wrong number of columns, images of the wrong
    shape, and labels past the model's last class, at load time instead of in round 1.
    """
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    probe = torch.as_tensor(np.ascontiguousarray(samples.x[:PROBE]), dtype=dtype, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(probe)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(
            f"{samples.name}: the {role} data's features of shape {tuple(samples.x.shape[1:])} do not fit "
            f"the model ({first_line[:200]})"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != len(probe):
        return  # not a classifier's logits: the labels cannot be checked against its classes
    classes = int(out.shape[1])
    top = int(samples.y.max())
    if top >= classes:
        bad = int(np.count_nonzero(samples.y >= classes))
        raise DataError(
            f"{samples.name}: {bad} {role} labels are {classes} or more (largest {top}), but the model "
            f"predicts {classes} classes (0..{classes - 1})"
        )
