"""Validated inputs of a round's game: w_t, the deltas, sample counts, validation data, metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.fl.aggregation import RULES, AggregationRule
from fedsv.fl.distances import pairwise_distances
from fedsv.fl.evaluation import predict
from fedsv.fl.state import federated_state
from fedsv.valuation.games.game import BoolMatrix

METRICS = ("accuracy", "neg_loss")
AGGREGATIONS = RULES

Metric = str | Callable[[Tensor, Tensor], Tensor]
"""A metric name in METRICS, or (logits (n, classes), y (n,)) -> per-sample scores (n,); U = mean score."""


def _as_tensor(value: Tensor | np.ndarray, what: str) -> Tensor:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, Tensor):
        return value.detach()
    raise ValueError(f"{what} must be a torch.Tensor or numpy array, got {type(value).__name__}")


@dataclass
class RoundInputs:
    """Everything a round's utility needs, checked once: names, shapes, dtypes, finiteness.

    `names` are the model's federated state (federated_state): parameters and floating-point buffers.
    Every tensor lives on one device (`device`), where `build` put it once, in the dtype of w_t.
    """

    names: list[str]
    global_params: dict[str, Tensor]
    delta_matrices: dict[str, Tensor]  # per name: the m deltas of that tensor as rows, (m, numel)
    weights: Tensor  # the participants' sample counts (the weights of FedAvg, Krum and Multi-Krum)
    server_lr: float
    x_val: Tensor
    y_val: Tensor
    metric: Metric
    rule: AggregationRule = field(default_factory=AggregationRule)
    distances: Tensor | None = None  # pairwise squared distances of the deltas (selecting rules)
    classes: int = 0  # the model's outputs: scores are split by validation label (set by RoundGame)
    folds: int = 1  # validation folds: scores are split by (label, fold) cells (set by RoundGame)
    bins: Tensor | None = None  # each validation sample's cell, label * folds + fold (set by RoundGame)

    @property
    def width(self) -> int:
        """Columns of the executors' score totals: one per (label, fold) cell."""
        return self.classes * self.folds

    def cells(self, start: int = 0, stop: int | None = None) -> Tensor:
        """The cells (label * folds + fold) of validation samples start..stop."""
        bins = self.y_val if self.bins is None else self.bins
        return bins[start:stop]

    @property
    def m(self) -> int:
        """Number of participants (deltas)."""
        return int(self.weights.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.y_val.shape[0])

    @property
    def device(self) -> torch.device:
        return self.x_val.device

    def delta_matrix(self, name: str) -> Tensor:
        """The m deltas of one tensor as a (m, numel) matrix."""
        return self.delta_matrices[name]

    @classmethod
    def build(
        cls,
        model: nn.Module,
        global_params: Mapping[str, Tensor],
        deltas: Sequence[Mapping[str, Tensor]],
        sample_counts: Sequence[float],
        x_val: Tensor | np.ndarray,
        y_val: Tensor | np.ndarray,
        metric: Metric,
        aggregation: str | AggregationRule,
        server_lr: float,
        device: torch.device | str = "cpu",
    ) -> RoundInputs:
        """Check the inputs and move them to `device`, once: w_t, the deltas (stacked), weights, x, y."""
        device = torch.device(device)
        if isinstance(metric, str):
            if metric not in METRICS:
                raise ValueError(f"unknown metric {metric!r}; choose one of {list(METRICS)}")
        elif not callable(metric):
            raise ValueError(
                f"metric must be a name in {list(METRICS)} or a callable, not {type(metric).__name__}"
            )
        if isinstance(aggregation, str):
            if aggregation not in AGGREGATIONS:
                raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {list(AGGREGATIONS)}")
            aggregation = AggregationRule(aggregation)
        if not math.isfinite(server_lr) or server_lr <= 0:
            raise ValueError(f"server_lr must be a positive finite number, got {server_lr}")
        if len(deltas) == 0:
            raise ValueError("empty round: a round game needs at least one participant's delta")
        if len(sample_counts) != len(deltas):
            raise ValueError(f"{len(sample_counts)} sample counts for {len(deltas)} deltas")
        counts = np.asarray(sample_counts, dtype=np.float64)
        if not np.all(np.isfinite(counts)) or np.any(counts <= 0):
            raise ValueError("sample counts must be positive and finite")

        reference = federated_state(model)
        names = list(reference)
        glob = cls._check_params(global_params, reference, "global model")
        dtype = next(iter(glob.values())).dtype
        checked = [cls._check_params(d, reference, f"delta {i}") for i, d in enumerate(deltas)]

        x = _as_tensor(x_val, "x_val")
        y = _as_tensor(y_val, "y_val").reshape(-1)
        if x.shape[0] == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"validation data needs matching non-empty x and y, got {x.shape[0]} and {y.shape[0]}"
            )
        weights = torch.from_numpy(counts)
        # One copy to the device per tensor; the deltas of each tensor go stacked, as the game uses them.
        matrices = {
            name: torch.stack([d[name].reshape(-1).to(dtype) for d in checked]).to(device) for name in names
        }
        distances = pairwise_distances(list(matrices.values())) if aggregation.selects else None
        return cls(
            names,
            {name: value.to(device=device, dtype=dtype) for name, value in glob.items()},
            matrices,
            weights.to(device=device, dtype=dtype),
            float(server_lr),
            x.to(device=device, dtype=dtype),
            y.to(device=device, dtype=torch.long),
            metric,
            aggregation,
            distances,
        )

    @staticmethod
    def _check_params(
        params: Mapping[str, Tensor],
        reference: Mapping[str, Tensor],
        what: str,
    ) -> dict[str, Tensor]:
        missing = sorted(set(reference) - set(params))
        extra = sorted(set(params) - set(reference))
        if missing or extra:
            raise ValueError(
                f"{what}: tensor names do not match the model (missing {missing}, unexpected {extra})"
            )
        out: dict[str, Tensor] = {}
        for name, ref in reference.items():
            value = params[name]
            if not isinstance(value, Tensor):
                raise ValueError(f"{what}: {name} is a {type(value).__name__}, not a tensor")
            if tuple(value.shape) != tuple(ref.shape):
                raise ValueError(
                    f"{what}: {name} has shape {tuple(value.shape)}, model expects {tuple(ref.shape)}"
                )
            if not value.is_floating_point():
                raise ValueError(f"{what}: {name} has non-float dtype {value.dtype}")
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"{what}: {name} contains non-finite values (NaN or Inf)")
            out[name] = value.detach()
        return out


def coalition_weights(members: BoolMatrix, inputs: RoundInputs) -> Tensor:
    """Per-coalition aggregation coefficients c (B, m), on the inputs' device: w_t + c @ deltas is S.

    A coordinate-wise rule (median, trimmed mean) has no such coefficients: its rows are the
    membership itself (1.0 for a member), which RoundGame combines by the rule instead of a product.
    """
    mask = torch.from_numpy(np.asarray(members, dtype=bool)).to(inputs.device)
    if inputs.rule.coordinatewise:
        return mask.to(inputs.weights.dtype)
    coeffs = inputs.rule.coefficients(mask, inputs.weights, inputs.distances)
    return coeffs.to(inputs.weights.dtype) * inputs.server_lr


def score_logits(logits: Tensor, y: Tensor, metric: Metric, cells: Tensor, width: int) -> Tensor:
    """Per coalition and cell, the sum of the per-sample scores of the samples in that cell (a validation
    label and fold, RoundInputs.cells): float64 (B, width) on the logits' device. The row sums are the
    coalitions' scores (U times n); every metric here is a mean of per-sample scores, so each splits by
    cell the same way.

    `logits` has shape (B, n, classes); logits in a lower precision (bfloat16 under autocast) are scored
    in float32. Nothing here waits for the device: the caller copies the totals to the host.
    """
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    batch = logits.shape[0]
    if callable(metric):
        rows = []
        for b in range(batch):
            scores = metric(logits[b], y)
            if not isinstance(scores, Tensor) or tuple(scores.shape) != (y.shape[0],):
                shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
                raise ValueError(
                    f"metric must return one score per sample, shape ({y.shape[0]},); got {shape}"
                )
            rows.append(scores.detach().to(device=logits.device, dtype=torch.float64))
        per_sample = torch.stack(rows)
    elif metric == "accuracy":
        per_sample = (logits.argmax(dim=-1) == y.unsqueeze(0)).to(torch.float64)
    else:
        log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
        per_sample = log_probs.gather(-1, y.view(1, -1, 1).expand(batch, -1, 1)).squeeze(-1)
    return by_cell(per_sample, cells, width)


def by_cell(per_sample: Tensor, cells: Tensor, width: int) -> Tensor:
    """(B, n) per-sample scores summed per cell: (B, width)."""
    out = torch.zeros((per_sample.shape[0], width), dtype=torch.float64, device=per_sample.device)
    return out.index_add_(1, cells, per_sample.to(torch.float64))


def score_params(
    model: nn.Module, params: Mapping[str, Tensor] | None, x: Tensor, y: Tensor, metric: Metric
) -> float:
    """The utility of one model: `metric`'s mean over (x, y) with `params` substituted (the model's own
    weights with None), as a round game scores a coalition."""
    logits = predict(model, params, x)
    cells = torch.zeros(len(y), dtype=torch.int64, device=logits.device)
    return float(score_logits(logits[None], y.to(logits.device), metric, cells, 1).sum().item()) / max(
        len(y), 1
    )
