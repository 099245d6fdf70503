"""Whether the unanimous-image screen would pay: validation images every coalition classifies alike.

Usage: python benchmarks/bench_unanimous.py [--rounds 2,6,10] [--members 10,20] [--validation 1000]
       [--sample 1000]

Issue 36's probe found that half the MLP's validation images (round 6, m = 10) are classified alike by
every coalition, all of them flagged by m + 2 passes (the empty coalition, each member alone, all of
them): skipping them would halve a coalition's work, exactly, if it could be proved. This measures, per
FedAvg round of the paper's MLP (the embedded MNIST sample, IID) and per m:

- "unanimous": images every coalition classifies alike: all 2^m at m <= 12, else the m + 2 flagging
  coalitions and --sample random ones (an upper bound on the true count);
- "flagged": images the m + 2 passes classify alike (a superset of the unanimous);
- "proved": images an interval bound proves alike. Under FedAvg every coalition's parameters lie in the
  hull of w_t and the m points w_t + delta_i; the first layer's outputs lie between their least and
  greatest over those vertices (they are linear in the parameters); a ReLU maps a box to a box; a
  Linear layer fed a box with parameters in the hull lies within the vertices' interval products; the
  last layer bounds the predicted class's margin over each other class. Only a proof lets a screen
  skip an image and keep the values exact;
- "proved at 0.1x": the same with the deltas scaled by 0.1, which shows how far the bound is from the
  round's own spread.

Prints the machine first; the counts are deterministic (seed 0).
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
from fixtures import RealRound, machine, print_table, train_round
from torch import Tensor, nn
from torch.func import functional_call

from fedsv.data import load_dataset
from fedsv.task.models import build_model

ALL_COALITIONS_UP_TO = 12
"""Up to this m every coalition is evaluated; beyond, the flagging ones and a random sample."""


def vertices(rnd: RealRound, name: str) -> Tensor:
    """One tensor at the hull's m + 1 vertices (m + 1, *shape), float64: w_t, then w_t + delta_i."""
    base = rnd.global_params[name].double()
    return torch.stack([base, *(base + d[name].double() for d in rnd.deltas)])


def proved(rnd: RealRound, model: nn.Module, predicted: Tensor) -> Tensor:
    """Images (a bool mask) the interval bound proves every coalition classifies as `predicted`."""
    x = rnd.x_val.double().flatten(1)
    linears = [(name, layer) for name, layer in model.named_children() if isinstance(layer, nn.Linear)]
    lo = hi = x
    for k, (name, _) in enumerate(linears):
        weight, bias = vertices(rnd, f"{name}.weight"), vertices(rnd, f"{name}.bias")
        center, radius = (hi + lo) / 2, (hi - lo) / 2
        if k == len(linears) - 1:
            least = torch.full(predicted.shape, torch.inf, dtype=torch.float64)
            for v in range(weight.shape[0]):
                diff = weight[v][predicted][:, None, :] - weight[v][None]  # (n, classes, in)
                bound = torch.einsum("ni,nki->nk", center, diff)
                bound -= torch.einsum("ni,nki->nk", radius, diff.abs())
                bound += bias[v][predicted][:, None] - bias[v][None]
                bound.scatter_(1, predicted[:, None], torch.inf)
                least = torch.minimum(least, bound.amin(dim=1))
            return least > 0
        mid = torch.einsum("ni,voi->vno", center, weight) + bias[:, None, :]
        spread = torch.einsum("ni,voi->vno", radius, weight.abs())
        lo, hi = (mid - spread).amin(dim=0).clamp_min(0), (mid + spread).amax(dim=0).clamp_min(0)  # + ReLU
    raise AssertionError("the MLP ends with a Linear layer")


def predictions(rnd: RealRound, model: nn.Module, members: np.ndarray) -> Tensor:
    """Each coalition's predicted class of each validation image (coalitions, n)."""
    weights = members * np.asarray(rnd.counts, dtype=np.float64)  # FedAvg: sample-weighted mean
    coeffs = torch.from_numpy(weights / np.maximum(weights.sum(axis=1, keepdims=True), 1e-300))
    rows = []
    with torch.no_grad():
        for c in coeffs:
            state = {
                k: v + sum(float(ci) * d[k] for ci, d in zip(c, rnd.deltas, strict=True))
                for k, v in rnd.global_params.items()
            }
            rows.append(functional_call(model, state, (rnd.x_val,)).argmax(dim=1))
    return torch.stack(rows)


def counts(rnd: RealRound, sample: int) -> list[str]:
    m = rnd.m
    model = build_model("mlp", rnd.input_shape).eval()
    flagging = np.vstack([np.zeros((1, m), bool), np.eye(m, dtype=bool), np.ones((1, m), bool)])
    if m <= ALL_COALITIONS_UP_TO:
        everything = np.array(list(itertools.product([False, True], repeat=m)), dtype=bool)
    else:
        everything = np.vstack([flagging, np.random.default_rng(0).random((sample, m)) < 0.5])
    flagged = predictions(rnd, model, flagging)
    alike = predictions(rnd, model, everything)
    predicted = flagged[0]
    scaled = RealRound(**{**rnd.__dict__, "deltas": [{k: 0.1 * t for k, t in d.items()} for d in rnd.deltas]})
    n = rnd.x_val.shape[0]

    def share(mask: Tensor) -> str:
        return f"{int(mask.sum())} ({int(mask.sum()) / n:.1%})"

    return [
        share((alike == alike[0]).all(dim=0)),
        share((flagged == predicted).all(dim=0)),
        share(proved(rnd, model, predicted)),
        share(proved(scaled, model, predicted)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", default="2,6,10", help="FedAvg rounds trained before the valued one")
    parser.add_argument("--members", default="10,20")
    parser.add_argument("--validation", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=1000, help="random coalitions beyond m = 12")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    print(machine())
    splits = load_dataset("embedded", seed=0, validation_size=args.validation)
    rows = []
    for m in (int(v) for v in args.members.split(",")):
        for rounds in (int(v) for v in args.rounds.split(",")):
            rnd = train_round(
                "mlp",
                splits.train.x,
                splits.train.y,
                splits.validation.x,
                splits.validation.y,
                m,
                rounds=rounds,
            )
            coalitions = f"all {2**m}" if m <= ALL_COALITIONS_UP_TO else f"{m + 2} + {args.sample} sampled"
            rows.append([f"mlp m={m}", str(rounds), coalitions, *counts(rnd, args.sample)])
            print(" | ".join(rows[-1]), flush=True)
    print()
    header = ["round", "FedAvg round", "coalitions", "unanimous", "flagged", "proved", "proved at 0.1x"]
    print_table(header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
