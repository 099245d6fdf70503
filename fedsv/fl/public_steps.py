"""Updates the coordinator could have made itself: the global model's recent steps, and the screen that
turns away an update carrying nothing beyond them (a mimicking free rider's).

A free rider without data can still send something that looks like training: the federation's own
recent step, (w_t - w_s) / (t - s), from the global models it was sent (Fraboni et al., AISTATS 2021;
the "delta weight" attack), with or without noise. Its direction is the federation's, so the direction
check passes it, and in a round's game another step along the federation's path is worth something: the
values alone cannot tell it holds no data. The coordinator broadcast those models itself, so it keeps the
last steps of the global model (PublicSteps) and asks of each update what it adds beyond their span:

- an update whose part beyond the span is nothing (below EXACT of its norm), or is noise, carries
  nothing learned from data, and is turned away, however much of it lies along the span (a mimic with
  noise of its step's size has 71% of its norm there, one with three times that 32%, a noise sender
  none). In the run's first round no step is known yet, and the whole update is tested for noise.
  Noise is told by two tests that must both find it: a random direction (no more related to the
  validation loss's descent and to the round's other updates than Gaussian noise is, as update_screen's
  null test asks: d (c_descent^2 + c_others^2) below NULL_QUANTILE, with both projected off the span
  too), and spread over the model's units as isotropic noise spreads (each unit, a weight tensor's row
  or a vector, holds energy in proportion to its parameters: Bartlett's test of equal variances, at
  ISOTROPY_LEVEL);
- an honest member's update, even from little data, is its own SGD from w_t: its part beyond the past
  steps follows its data's gradient at w_t, which the validation set's descent and the others' updates
  share beyond chance, and, whether or not it does (measured: an honest MNIST member's part beyond the
  steps was as unrelated to both as noise in 2 of its 4 rounds, and one with 15 samples of a small MLP's
  too), it is nothing like isotropic: training moves some neurons far more than others and leaves a dead
  ReLU's alone, where noise moves every row alike.

The steps are kept in memory only (at most STEPS of them and MAX_BYTES in all): after a coordinator
restart the screen starts again from the models it then sends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

import torch
from scipy.stats import chi2
from torch import Tensor

from fedsv.fl.updates import ClientUpdate

STEPS = 16
"""Recent steps of the global model kept: a mimic replaying the step from its last selection up to this
many rounds back is in their span."""

MAX_BYTES = 512 * 2**20
"""The steps never hold more than this (float32): a large model keeps fewer steps."""

EXACT = 1e-3
"""A part beyond the steps below this share of the update's norm is rounding: the update is a step."""

ISOTROPY_LEVEL = 1e-3
"""The isotropy test's level: a mimic's isotropic noise fails it 1 time in 1,000."""

NULL_QUANTILE = 13.8
"""The 99.9% point of chi-square with 2 degrees of freedom (update_screen.NULL_QUANTILE's test)."""


class PublicSteps:
    """The global model's last steps w_{k+1} - w_k (flattened float32 over its floating tensors in name
    order), learned from the models the coordinator sends, one a round."""

    def __init__(self, keep: int = STEPS) -> None:
        self.keep = keep
        self.names: list[str] = []
        self.sizes: dict[str, int] = {}
        self.units: list[int] = []  # each unit's parameter count, in the flat order (rows, or a tensor)
        self.steps: deque[Tensor] = deque()
        self._last: Tensor | None = None
        self._inverse: Tensor | None = None

    def observe(self, params: Mapping[str, Tensor]) -> None:
        """Remember w_t (this round's global model) and the step from the last one observed (a step of 0,
        a round that moved nothing, is not kept)."""
        names = sorted(k for k, t in params.items() if t.is_floating_point())
        flat = torch.cat([params[k].detach().reshape(-1).to(torch.float64).cpu() for k in names])
        if names != self.names or self._last is None or self._last.shape != flat.shape:
            self.names, self.steps, self._last = names, deque(), flat
            self.sizes = {k: params[k].numel() for k in names}
            self.units = [n for k in names for n in _units(params[k])]
            return
        step = (flat - self._last).to(torch.float32)
        self._last = flat
        self._inverse = None
        if not bool(torch.isfinite(step).all()):  # a model gone non-finite (or past float32): start afresh
            self.steps.clear()
            return
        if float(step.norm()) == 0.0:
            return
        self.steps.append(step)
        fits = max(2, MAX_BYTES // max(4 * step.numel(), 1))
        while len(self.steps) > min(self.keep, fits):
            self.steps.popleft()

    def flat(self, delta: Mapping[str, Tensor]) -> Tensor:
        """A delta over the model's floating tensors, flattened in the steps' order (0 where missing)."""
        return torch.cat(
            [
                delta[k].detach().reshape(-1).to(torch.float64).cpu()
                if k in delta
                else torch.zeros(self.sizes[k], dtype=torch.float64)
                for k in self.names
            ]
        )

    def isotropic(self, part: Tensor) -> bool:
        """Whether `part` (flattened as the steps) spreads its energy over the model's units as isotropic
        Gaussian noise does (module doc); False for a model of one unit (nothing to compare: no update
        is taken for noise on the direction test alone)."""
        if len(self.units) < 2:
            return False
        energy = torch.stack([(chunk * chunk).sum() for chunk in torch.split(part, self.units)])
        counts = torch.tensor(self.units, dtype=torch.float64)
        total, whole = float(energy.sum()), float(counts.sum())
        if total <= 0:
            return True
        if bool((energy <= 0).any()):
            return False  # a unit left exactly alone: noise never does that, training does (a dead ReLU)
        # Bartlett's test of equal variances with known zero means: chi-square with (units - 1) degrees
        statistic = whole * math.log(total / whole) - float((counts * torch.log(energy / counts)).sum())
        correction = 1.0 + (float((1.0 / counts).sum()) - 1.0 / whole) / (3.0 * (len(self.units) - 1))
        return statistic / correction < float(chi2.isf(ISOTROPY_LEVEL, len(self.units) - 1))

    def along(self, vector: Tensor) -> Tensor:
        """The projection of `vector` (flattened as the steps, float64) on the kept steps' span (zeros
        while none is kept), through their k x k Gram matrix: no d x k copy of the steps is made (a
        ResNet-18's step is 45 MB), each step is widened to float64 one at a time."""
        if not self.steps:
            return torch.zeros_like(vector)
        wide = [s.to(torch.float64) for s in self.steps] if len(self.steps) * vector.numel() < 2**24 else None
        rows = wide if wide is not None else (s.to(torch.float64) for s in self.steps)
        products = torch.stack([row @ vector for row in rows])
        coefficients = self._gram() @ products
        rows = wide if wide is not None else (s.to(torch.float64) for s in self.steps)
        out = torch.zeros_like(vector)
        for c, row in zip(coefficients.tolist(), rows, strict=True):
            out.add_(row, alpha=c)
        return out

    @property
    def rank(self) -> int:
        """The dimension of the kept steps' span."""
        return int(torch.linalg.matrix_rank(self._gram(), hermitian=True, rtol=1e-9)) if self.steps else 0

    def _gram(self) -> Tensor:
        """The pseudo-inverse of the steps' Gram matrix (float64), computed once per step learned."""
        if self._inverse is None or self._inverse.shape[0] != len(self.steps):
            rows = [s.to(torch.float64) for s in self.steps]
            gram = torch.stack([torch.stack([a @ b for b in rows]) for a in rows])
            try:
                self._inverse = torch.linalg.pinv(gram, hermitian=True, rtol=1e-9)
            except torch.linalg.LinAlgError:  # the eigensolver did not converge: the SVD's pseudo-inverse
                self._inverse = torch.linalg.pinv(gram, rtol=1e-9)
        return self._inverse


def mimicked(
    updates: Sequence[ClientUpdate], public: PublicSteps, descent: Mapping[str, Tensor]
) -> dict[str, float]:
    """Participants whose update carries nothing beyond the global model's recent steps (module doc),
    a zero update too, with the share of its norm along them. Never every update."""
    if not updates or not public.names:
        return {}
    flats = {u.participant: public.flat(u.delta) for u in updates}
    size_of = sum(public.sizes.values())
    if any(f.shape[0] != size_of for f in flats.values()):
        return {}  # a model of other tensors than the steps': nothing to compare with
    # no step yet (the run's first round): nothing is public but w_t itself

    def beyond(v: Tensor) -> Tensor:
        return v - public.along(v)

    reference = beyond(public.flat(descent))
    weights = {u.participant: float(u.num_samples) for u in updates}
    total = sum(weights.values())
    summed = sum((weights[p] * flats[p] for p in flats), torch.zeros_like(reference))
    freedom = size_of - public.rank
    out: dict[str, float] = {}
    for pid, flat in flats.items():
        size = float(flat.norm())
        if size == 0.0:  # nothing at all (where the screens run, update_screen's null test took it first)
            out[pid] = 0.0
            continue
        rest = beyond(flat)
        along = float((flat - rest).norm()) / size
        if float(rest.norm()) <= EXACT * size:
            out[pid] = along
            continue
        others = beyond((summed - weights[pid] * flat) / max(total - weights[pid], 1e-300))
        spread = freedom * (_cosine(rest, reference) ** 2 + _cosine(rest, others) ** 2)
        if spread < NULL_QUANTILE and public.isotropic(rest):
            out[pid] = along
    return {} if len(out) == len(updates) else out


def _units(tensor: Tensor) -> list[int]:
    """A tensor's units in flat order: each output row (a neuron's or a channel's weights) of a tensor of
    two or more dimensions, a vector (biases, a norm's scale) as one."""
    if tensor.dim() >= 2 and tensor.shape[0] > 0:
        return [tensor.numel() // tensor.shape[0]] * tensor.shape[0]
    return [tensor.numel()] if tensor.numel() else []


def _cosine(a: Tensor, b: Tensor) -> float:
    norm = float(a.norm()) * float(b.norm())
    return float(a @ b) / norm if norm > 0 and math.isfinite(norm) else 0.0
