"""The screen of updates trained on data unlike any the validation set holds (made-up inputs).

A model's first layer with parameters, a Linear or a Conv2d that sees the data through parameter-free
steps only, moves in the span of the inputs it was trained on: its weight delta is a sum of
(gradient x input) outer products, so each of its rows lies in the span of the training inputs (for a
convolution, of their patches). Data like the coordinator's validation data lie, nearly all their
energy, in the subspace of the validation inputs' leading principal directions; inputs made up at
random (uniform over the data's range, say) spread their energy over every direction alike. So the
share of a delta's first-layer energy outside that subspace is small for every honest member (under
0.03 on the embedded MNIST, IID or two classes each, 15 samples or 150) and large for a member that
trained on made-up inputs (0.35-0.5 there). Adding honest-looking steps to such an update dilutes the
share, which still stands far above the round's (0.1-0.4).

The screen speaks only where the data leave many directions empty: not where the validation inputs
fill nearly every direction (tabular features; a convolution's 5x5 image patches).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsv.fl.evaluation import EvalSet, to_tensors
from fedsv.fl.updates import ClientUpdate

logger = logging.getLogger(__name__)

ENERGY = 0.999
"""The validation inputs' second moment the subspace keeps (its leading principal directions)."""

ISOTROPIC_SHARE = 0.5
"""An update is off the data when its share outside the subspace is at least this fraction of what
inputs spread over every direction alike would put there ((d - k) / d)."""

ROUND_MULTIPLE = 5.0
"""...or, in a round of three updates or more, its share is over this multiple of the round's median and
over FLOOR of noise's: a made-up update diluted by honest-looking steps still stands apart."""

FLOOR = 0.1
"""The least share, as a fraction of noise's, that the round's comparison acts on."""

MIN_ISOTROPIC = 0.2
"""The screen speaks where the validation inputs leave at least this share of the directions empty
(the MNIST MLP's 784 pixels: about half; 5x5 image patches of a convolution: 4%, too few to tell)."""

MAX_SAMPLES = 2000
"""Validation inputs (or patches) the subspace is estimated from, at most (a seeded subsample)."""


@dataclass(frozen=True)
class InputSpan:
    """The first layer's weight (its name in the delta), the orthonormal basis (d, k) of the validation
    inputs' leading subspace in that layer's input space, and its dimension d."""

    weight: str
    basis: Tensor
    dimension: int

    @property
    def isotropic(self) -> float:
        """The share outside the subspace of a delta whose inputs fill every direction alike."""
        return (self.dimension - self.basis.shape[1]) / self.dimension

    def outside(self, delta: Mapping[str, Tensor]) -> tuple[float, float]:
        """(energy outside the subspace, its share of the first layer's delta energy)."""
        w = delta[self.weight].detach().to(torch.float64).reshape(delta[self.weight].shape[0], -1)
        total = float((w * w).sum())
        inside = w @ self.basis
        out = max(total - float((inside * inside).sum()), 0.0)
        return out, (out / total if total > 0 else 0.0)


def _first_layer(model: nn.Module, x: Tensor) -> tuple[str, nn.Module, Tensor] | None:
    """The first module with parameters the forward calls, with its input, if it is a Linear or a
    Conv2d with groups 1 (else None: its input depends on parameters, or no span is defined)."""
    found: list[tuple[str, nn.Module, Tensor]] = []
    names = {m: n for n, m in model.named_modules()}
    hooks = []

    def record(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        if not found and any(True for _ in module.parameters(recurse=False)):
            found.append((names[module], module, args[0].detach()))

    for module in model.modules():
        hooks.append(module.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    if not found:
        return None
    name, module, inputs = found[0]
    conv = isinstance(module, nn.Conv2d) and module.groups == 1
    return (name, module, inputs) if isinstance(module, nn.Linear) or conv else None


def input_span(model: nn.Module, validation: EvalSet, seed: int = 0) -> InputSpan | None:
    """The span of the validation inputs seen by `model`'s first layer (None where the screen cannot
    speak: no Linear or Conv2d first, or inputs that fill every direction)."""
    x, _ = to_tensors(validation.x, validation.y)
    was_training = model.training
    model.eval()
    try:
        first = _first_layer(model, x)
    except Exception:  # a model the screen cannot follow is not screened: the run goes on without it
        logger.warning("the made-up-input screen cannot follow the model's forward: off", exc_info=True)
        return None
    finally:
        model.train(was_training)
    if first is None:
        return None
    name, module, inputs = first
    if isinstance(module, nn.Conv2d):
        padding = 0 if isinstance(module.padding, str) else module.padding  # "same": the inner patches
        patches = F.unfold(inputs, module.kernel_size, module.dilation, padding, module.stride)
        rows = patches.transpose(1, 2)
        rows = rows.reshape(-1, rows.shape[-1])
    else:
        rows = inputs.reshape(-1, inputs.shape[-1])
    rows = rows.to(torch.float64)
    if rows.shape[0] > MAX_SAMPLES:
        chosen = np.random.default_rng(seed).choice(rows.shape[0], size=MAX_SAMPLES, replace=False)
        rows = rows[torch.as_tensor(np.sort(chosen))]
    _, s, vt = torch.linalg.svd(rows, full_matrices=False)
    energy = torch.cumsum(s * s, 0) / torch.sum(s * s)
    k = int(torch.searchsorted(energy, torch.tensor(ENERGY, dtype=energy.dtype))) + 1
    dimension = rows.shape[1]
    if dimension - k < MIN_ISOTROPIC * dimension:
        return None
    return InputSpan(f"{name}.weight" if name else "weight", vt[:k].T.contiguous(), dimension)


def off_data(updates: Sequence[ClientUpdate], span: InputSpan | None) -> dict[str, float]:
    """Participant -> its share outside the validation data's span, for the updates trained on inputs
    unlike the data: a share at least ISOTROPIC_SHARE of noise's, or, with three updates or more, over
    ROUND_MULTIPLE x the round's median share and FLOOR of noise's; never more than a minority."""
    if span is None or not updates or any(span.weight not in u.delta for u in updates):
        return {}
    shares = {u.participant: span.outside(u.delta)[1] for u in updates}
    typical = statistics.median(shares.values())
    found = {
        pid: share
        for pid, share in shares.items()
        if share >= ISOTROPIC_SHARE * span.isotropic
        or (len(updates) >= 3 and share > ROUND_MULTIPLE * typical and share >= FLOOR * span.isotropic)
    }
    if 2 * len(found) >= len(updates):  # a majority unlike the validation data: the set, not them
        return {}
    return found
