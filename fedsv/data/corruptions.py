"""Participant corruptions: the paper's label flipping and pixel backdoor, a scaled (poisoned) delta, and
free riders' updates (noise in place of a delta, the global model sent back untrained, the federation's
own recent step replayed from the global models it received)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from fedsv.data.collusion import ATTACKS, FACTORS
from fedsv.data.dataset import ArrayDataset
from fedsv.fl.evaluation import evaluate

logger = logging.getLogger(__name__)

ImageT = TypeVar("ImageT", np.ndarray, Tensor)


def flip_labels(
    y: np.ndarray, ratio: float, num_classes: int, seed: int, *, own_classes: bool = False
) -> np.ndarray:
    """A copy of y in which exactly round(ratio * n) seeded-random labels are replaced by another class.

    The new class is uniform among the num_classes - 1 others, so every flipped label really changes.
    With own_classes, it is uniform among the other classes present in y instead (noise that stays
    within a non-IID participant's own classes); y holding a single class is then left as it is.
    """
    if own_classes:
        present = np.unique(np.asarray(y))
        if len(present) < 2:
            return np.asarray(y).copy()
        flipped = flip_labels(np.searchsorted(present, y), ratio, len(present), seed)
        return present[flipped].astype(np.asarray(y).dtype)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"label flip ratio must lie in [0, 1], got {ratio}")
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    out = labels.copy()
    count = round(ratio * len(labels))
    if count == 0:
        return out
    if num_classes < 2:
        raise ValueError(f"flipping labels needs num_classes >= 2, got {num_classes}")
    if int(labels.min()) < 0 or int(labels.max()) >= num_classes:
        raise ValueError(f"labels must lie in 0..{num_classes - 1} to be flipped")
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(labels), size=count, replace=False)
    offsets = rng.integers(1, num_classes, size=count)
    out[chosen] = (labels[chosen] + offsets) % num_classes
    return out


@dataclass(frozen=True)
class PixelBackdoor:
    """BadNets-style trigger (Gu et al.): a trigger_size x trigger_size checkerboard of max (1.0) and min
    (0.0) pixels, in all channels, `margin` pixels from the bottom-right corner. Poisoned images are
    relabelled to target_label; per_batch of every batch_size training images are poisoned (the paper:
    20 of 64)."""

    target_label: int = 0
    per_batch: int = 20
    batch_size: int = 64
    trigger_size: int = 4
    margin: int = 1

    def __post_init__(self) -> None:
        if self.target_label < 0:
            raise ValueError(f"backdoor target_label must be >= 0, got {self.target_label}")
        if self.batch_size < 1:
            raise ValueError(f"backdoor batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.per_batch <= self.batch_size:
            raise ValueError(
                f"backdoor per_batch must lie in 0..batch_size={self.batch_size}, got {self.per_batch}"
            )
        if self.trigger_size < 1 or self.margin < 0:
            raise ValueError(
                f"backdoor needs trigger_size >= 1 and margin >= 0, got {self.trigger_size}, {self.margin}"
            )

    def pattern(self) -> np.ndarray:
        """The trigger as a float32 (trigger_size, trigger_size) checkerboard of 1.0 and 0.0."""
        i, j = np.indices((self.trigger_size, self.trigger_size))
        return ((i + j) % 2 == 0).astype(np.float32)

    def region(self, height: int, width: int) -> tuple[slice, slice]:
        """(rows, cols) slices of the trigger in an image of height x width."""
        need = self.trigger_size + self.margin
        if height < need or width < need:
            raise ValueError(
                f"trigger {self.trigger_size}px + margin {self.margin}px exceeds a {height}x{width} image"
            )
        r1, c1 = height - self.margin, width - self.margin
        return slice(r1 - self.trigger_size, r1), slice(c1 - self.trigger_size, c1)

    def stamp(self, x: ImageT) -> ImageT:
        """A copy of x (one image (C, H, W) or a batch (n, C, H, W)) with the trigger stamped in."""
        if x.ndim < 3:
            raise ValueError(f"stamp needs images of shape (C, H, W) or (n, C, H, W), got {tuple(x.shape)}")
        rows, cols = self.region(int(x.shape[-2]), int(x.shape[-1]))
        if isinstance(x, Tensor):
            out_t = x.clone()
            out_t[..., rows, cols] = torch.from_numpy(self.pattern()).to(dtype=x.dtype, device=x.device)
            return out_t
        out = np.array(x, copy=True)
        out[..., rows, cols] = self.pattern().astype(out.dtype)
        return out

    def is_stamped(self, x: np.ndarray | Tensor) -> np.ndarray:
        """Boolean per image of a batch (n, C, H, W): does it carry the trigger exactly?"""
        rows, cols = self.region(int(x.shape[-2]), int(x.shape[-1]))
        patch = np.asarray(x.detach().cpu() if isinstance(x, Tensor) else x)[..., rows, cols]
        return np.all(patch == self.pattern(), axis=(-3, -2, -1))

    def poison_count(self, batch_len: int) -> int:
        """How many images of a batch of batch_len are poisoned: per_batch scaled to the batch size."""
        if self.per_batch == 0 or batch_len == 0:
            return 0
        return min(batch_len, max(1, round(self.per_batch * batch_len / self.batch_size)))

    def poison_batch(self, xb: Tensor, yb: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A copy of the batch in which poison_count(len) random images carry the trigger and target_label."""
        if xb.shape[0] != yb.shape[0]:
            raise ValueError(f"batch has {xb.shape[0]} images but {yb.shape[0]} labels")
        k = self.poison_count(int(xb.shape[0]))
        if k == 0:
            return xb, yb
        chosen = torch.randperm(int(xb.shape[0]), generator=generator)[:k].to(xb.device)
        x_out = xb.clone()
        y_out = yb.clone()
        x_out[chosen] = self.stamp(xb[chosen])
        y_out[chosen] = self.target_label
        return x_out, y_out


def backdoor_success_rate(
    model: nn.Module, x: Tensor | np.ndarray, y: Tensor | np.ndarray, backdoor: PixelBackdoor
) -> float:
    """Fraction of the images whose true label is not the target that the model, once the trigger is
    stamped on them, classifies as target_label."""
    labels = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    keep = np.flatnonzero(labels != backdoor.target_label)
    if keep.size == 0:
        raise ValueError(
            f"no test images with a label other than the backdoor target {backdoor.target_label}"
        )
    images = torch.as_tensor(x, dtype=torch.float32)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"got {images.shape[0]} images but {labels.shape[0]} labels")
    triggered = backdoor.stamp(images[torch.from_numpy(keep).to(images.device)])
    targets = np.full(keep.size, backdoor.target_label, dtype=np.int64)
    accuracy, _ = evaluate(model, None, triggered, targets)
    return accuracy


@dataclass(frozen=True)
class Corruption:
    """What a participant does to its own data: flip a fraction of labels and/or poison with a backdoor."""

    label_flip_ratio: float = 0.0
    backdoor: PixelBackdoor | None = None
    delta_scale: float = 1.0  # model poisoning: the participant sends its delta times this
    flip_own_classes: bool = False  # flipped labels go to another of the participant's own classes
    declared_samples: int = 0  # a lie about its sample count (FedAvg's weight); 0: the true count
    noise_norm: float = 0.0  # a free rider: Gaussian noise of this L2 norm sent in place of its delta
    replay: bool = False  # a free rider: the global model sent back untrained (a zero delta)
    keep: int = 0  # a member with little data: only this many of its samples (0: all of them)
    mimic: float | None = None  # a free rider: the federation's step (w_t - w_s) / (t - s), plus noise
    # of this many times its norm (None: not a mimic)
    copy_of: int | None = None  # a second identity: the member holds this rank's data (simulated shards)
    made_up: bool = False  # holds no data: trains on inputs and labels it made up (simulated shards)
    adds_step: bool = False  # adds the federation's recent step (w_t - w_s) / (t - s) to what it sends
    collude: str | None = None  # a colluding attack (collusion.ATTACKS): alie, ipm (None: none)
    collude_factor: float = 0.0  # its factor (collusion.FACTORS where the spec names none)
    group: tuple[int, ...] = ()  # the colluding ranks (RunConfig.corruptions: the entry's ranks)
    seen: MimicMemory = field(default_factory=lambda: MimicMemory(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_norm) and self.noise_norm >= 0):
            raise ValueError(f"noise_norm must be a finite number >= 0, got {self.noise_norm}")
        if not 0.0 <= self.label_flip_ratio <= 1.0:
            raise ValueError(f"label_flip_ratio must lie in [0, 1], got {self.label_flip_ratio}")
        if not math.isfinite(self.delta_scale):
            raise ValueError(f"delta_scale must be a finite number, got {self.delta_scale}")
        if self.keep < 0:
            raise ValueError(f"keep must be 0 (every sample) or positive, got {self.keep}")
        if self.copy_of is not None and self.copy_of < 0:
            raise ValueError(f"copy_of must name a rank >= 0, got {self.copy_of}")
        if self.mimic is not None and not (math.isfinite(self.mimic) and self.mimic >= 0):
            raise ValueError(f"mimic's noise must be a finite multiple >= 0 of the step, got {self.mimic}")
        if self.collude is not None and self.collude not in ATTACKS:
            raise ValueError(f"collude must be one of {ATTACKS}, got {self.collude!r}")
        if not math.isfinite(self.collude_factor):
            raise ValueError(f"a colluding attack's factor must be finite, got {self.collude_factor}")
        if not 0 <= self.declared_samples <= 2**63 - 1:
            raise ValueError(
                f"declared_samples must be 0 (the true count) or positive, got {self.declared_samples}"
            )

    @property
    def is_clean(self) -> bool:
        return (
            self.label_flip_ratio == 0.0
            and self.backdoor is None
            and self.delta_scale == 1.0
            and self.declared_samples == 0
            and self.noise_norm == 0.0
            and not self.replay
            and self.mimic is None
            and self.keep == 0
            and self.copy_of is None
            and self.collude is None
            and not self.made_up
            and not self.adds_step
        )

    @property
    def touches_data(self) -> bool:
        """Whether it changes the participant's data (flipped labels, a backdoor, fewer samples, another
        rank's shard), not only what it sends."""
        changed = self.label_flip_ratio > 0 or self.backdoor is not None or self.keep > 0
        return changed or self.copy_of is not None or self.made_up

    @property
    def trains(self) -> bool:
        """Whether the participant trains at all (a replaying, mimicking or noise-sending free rider
        does not)."""
        return not (self.replay or self.noise_norm > 0 or self.mimic is not None)

    def send(
        self,
        delta: dict[str, Tensor],
        seed: int,
        global_state: Mapping[str, Tensor] | None = None,
        round: int = 0,
    ) -> dict[str, Tensor]:
        """The update the participant sends in place of `delta` (its real one, or zeros of its shape
        where it does not train): zeros when replaying, the federation's own recent step when mimicking
        (from `global_state`, w_t of `round`, and the last global model it received), seeded noise of
        noise_norm when sending noise, else the delta times delta_scale."""
        if self.replay:
            return {k: torch.zeros_like(t) for k, t in delta.items()}
        if self.mimic is not None:
            step = self.seen.step(delta, global_state, round)
            if self.mimic > 0:
                size = math.sqrt(sum(float((t.double() ** 2).sum()) for t in step.values()))
                noise = _noise(step, self.mimic * size, seed)
                step = {k: step[k] + noise[k] for k in step}
            return step
        if self.noise_norm > 0:
            return _noise(delta, self.noise_norm, seed)
        if self.adds_step:
            step = self.seen.step(delta, global_state, round)
            delta = {k: t + step[k] if t.is_floating_point() else t for k, t in delta.items()}
        return self.scale_delta(delta)

    def declared(self, true_count: int) -> int:
        """The sample count the participant declares at Join and in its updates."""
        return self.declared_samples or true_count

    def scale_delta(self, delta: dict[str, Tensor]) -> dict[str, Tensor]:
        """The delta the participant sends: its real one times delta_scale (floating tensors)."""
        if self.delta_scale == 1.0:
            return delta
        return {k: t * self.delta_scale if t.is_floating_point() else t for k, t in delta.items()}

    def apply_to_dataset(self, ds: ArrayDataset, seed: int) -> ArrayDataset:
        """The participant's data with label flipping applied (unchanged when label_flip_ratio is 0), and
        only `keep` of its samples (a seeded draw) where it keeps fewer."""
        if self.made_up:  # as many made-up samples: inputs uniform over the data's range, labels uniform
            rng = np.random.default_rng(seed)
            low, high = float(np.min(ds.x)), float(np.max(ds.x))
            x = rng.uniform(low, high, size=ds.x.shape).astype(ds.x.dtype)
            y = rng.integers(0, ds.num_classes, size=len(ds)).astype(ds.y.dtype)
            ds = replace(ds, x=x, y=y)
        if 0 < self.keep < len(ds):
            chosen = np.sort(np.random.default_rng(seed).choice(len(ds), size=self.keep, replace=False))
            ds = replace(ds, x=ds.x[chosen], y=ds.y[chosen])
        if self.label_flip_ratio == 0.0:
            return ds
        flipped = flip_labels(
            ds.y, self.label_flip_ratio, ds.num_classes, seed, own_classes=self.flip_own_classes
        )
        logger.info("flipped %d of %d labels", int(np.sum(flipped != ds.y)), len(ds))
        return replace(ds, y=flipped)

    def transform_batch(self, xb: Tensor, yb: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A training batch after backdoor poisoning (unchanged when there is no backdoor)."""
        if self.backdoor is None:
            return xb, yb
        return self.backdoor.poison_batch(xb, yb, generator)

    def describe(self) -> str:
        """The spec string parse_corruption reads back into this corruption."""
        parts = []
        if self.label_flip_ratio:
            parts.append(f"flip:{self.label_flip_ratio:g}" + (":own" if self.flip_own_classes else ""))
        if self.backdoor is not None:
            b, d = self.backdoor, PixelBackdoor()
            opts = [
                f"{key}={getattr(b, attr)}"
                for key, attr in _BACKDOOR_OPTIONS.items()
                if getattr(b, attr) != getattr(d, attr)
            ]
            parts.append("backdoor" + (":" + ",".join(opts) if opts else ""))
        if self.delta_scale != 1.0:
            parts.append(f"scale:{self.delta_scale:g}")
        if self.declared_samples:
            parts.append(f"count:{self.declared_samples}")
        if self.noise_norm:
            parts.append(f"noise:{self.noise_norm:g}")
        if self.replay:
            parts.append("replay")
        if self.mimic is not None:
            parts.append("mimic" + (f":{self.mimic:g}" if self.mimic else ""))
        if self.keep:
            parts.append(f"keep:{self.keep}")
        if self.copy_of is not None:
            parts.append(f"copy:{self.copy_of}")
        if self.made_up:
            parts.append("madeup")
        if self.adds_step:
            parts.append("step")
        if self.collude is not None:
            parts.append(f"{self.collude}:{self.collude_factor:g}")
        if self.group:
            parts.append("group:" + ",".join(str(r) for r in self.group))
        return "+".join(parts) or "none"


class MimicMemory:
    """What a mimicking free rider keeps between the rounds it is selected in: the last global model it
    received and that model's round (nothing is learned from data)."""

    def __init__(self) -> None:
        self.round = 0
        self.model: dict[str, Tensor] | None = None

    def step(
        self, like: Mapping[str, Tensor], global_state: Mapping[str, Tensor] | None, round: int
    ) -> dict[str, Tensor]:
        """(w_t - w_s) / (t - s) from w_t (`global_state`, round t) and the last model received, w_s;
        zeros of `like`'s shapes the first time (no step seen yet). Remembers w_t."""
        step = {k: torch.zeros_like(t) for k, t in like.items()}
        if global_state is None:
            return step
        if self.model is not None and round > self.round:
            gap = round - self.round
            for k, t in step.items():
                if t.is_floating_point() and k in self.model and k in global_state:
                    step[k] = ((global_state[k].to(t.device) - self.model[k]) / gap).to(t.dtype)
        self.round = round
        self.model = {k: t.detach().clone().to(like[k].device) for k, t in global_state.items() if k in like}
        return step


def _noise(like: Mapping[str, Tensor], norm: float, seed: int) -> dict[str, Tensor]:
    """Seeded Gaussian noise of L2 norm `norm` over `like`'s floating tensors (zeros elsewhere)."""
    generator = torch.Generator().manual_seed(seed)
    floats = [k for k, t in like.items() if t.is_floating_point()]
    noise = {k: torch.randn(like[k].shape, generator=generator, dtype=torch.float64) for k in floats}
    total = math.sqrt(sum(float((n * n).sum()) for n in noise.values()))
    scale = norm / total if total > 0 else 0.0
    sent = {k: torch.zeros_like(t) for k, t in like.items()}
    sent.update({k: (noise[k] * scale).to(like[k].dtype).to(like[k].device) for k in floats})
    return sent


_BACKDOOR_OPTIONS = {"target": "target_label", "per_batch": "per_batch", "batch_size": "batch_size"}


def _parse_backdoor(options: str, spec: str) -> PixelBackdoor:
    kwargs: dict[str, int] = {}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in _BACKDOOR_OPTIONS:
            raise ValueError(
                f"bad backdoor option {item!r} in {spec!r}; use key=value with keys {list(_BACKDOOR_OPTIONS)}"
            )
        try:
            kwargs[_BACKDOOR_OPTIONS[key.strip()]] = int(value)
        except ValueError:
            raise ValueError(
                f"backdoor option {key.strip()!r} needs an integer, got {value!r} in {spec!r}"
            ) from None
    return PixelBackdoor(**kwargs)


def parse_corruption(spec: str) -> Corruption:
    """Read a CLI corruption spec: "none", "flip:0.1", "flip:0.1:own" (flipped to the participant's own
    classes), "backdoor", "backdoor:target=7[,per_batch=20,batch_size=64]", "scale:10" (the update
    boosted), "count:10000000" (a false sample count declared), or several joined with "+"
    ("flip:0.2+backdoor", "scale:-1+count:10000000"); free riders: "noise:0.01" (Gaussian noise of that
    L2 norm sent in place of a delta, no training), "replay" (the global model sent back untrained) and
    "mimic" or "mimic:NOISE" (the federation's own recent step, (w_t - w_s) / (t - s) from the global
    models it received, plus Gaussian noise of NOISE times its norm: the disguised free rider); "keep:30"
    (a member with little data: 30 of its samples); "copy:4" (a second identity of rank 4's owner: a
    member holding a copy of rank 4's shard); "madeup" (a member with no data that makes up inputs and
    labels and trains on them as an honest member trains), "step" (adds the federation's recent step,
    as a mimic computes it, to what it sends: "madeup+step"); colluders: "alie[:TAU]" (a little is enough) and
    "ipm[:TAU]" (inner-product manipulation) with "group:1,2" naming the colluding ranks (the
    `--corrupt` entry's ranks where it names none: fedsv.data.collusion)."""
    text = spec.strip().lower()
    if text in ("", "none", "clean"):
        return Corruption()
    ratio = 0.0
    own = False
    backdoor: PixelBackdoor | None = None
    factor = 1.0
    declared = 0
    noise = 0.0
    replay = False
    mimic: float | None = None
    keep = 0
    copy_of: int | None = None
    made_up = False
    adds_step = False
    collude: str | None = None
    tau = 0.0
    group: tuple[int, ...] = ()
    for part in text.split("+"):
        kind, _, arg = part.strip().partition(":")
        if kind == "flip":
            arg, _, where = arg.partition(":")
            try:
                ratio = float(arg)
                if where not in ("", "own"):
                    raise ValueError(where)
            except ValueError:
                raise ValueError(
                    f"bad corruption {spec!r}: flip needs a ratio in [0, 1], e.g. flip:0.1 (or flip:0.1:own "
                    "to flip to the participant's own classes only)"
                ) from None
            own = where == "own"
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"bad corruption {spec!r}: flip ratio must lie in [0, 1]")
        elif kind == "backdoor":
            backdoor = _parse_backdoor(arg, spec)
        elif kind == "scale":
            try:
                factor = float(arg)
            except ValueError:
                raise ValueError(f"bad corruption {spec!r}: scale needs a number, e.g. scale:1e6") from None
            if not math.isfinite(factor):
                raise ValueError(f"bad corruption {spec!r}: scale must be finite")
        elif kind == "count":
            if not arg.isdigit() or not 1 <= int(arg) <= 2**63 - 1:
                raise ValueError(
                    f"bad corruption {spec!r}: count needs a positive whole number, e.g. count:10000000"
                )
            declared = int(arg)
        elif kind == "noise":
            try:
                noise = float(arg)
            except ValueError:
                raise ValueError(f"bad corruption {spec!r}: noise needs a norm, e.g. noise:0.01") from None
            if not (math.isfinite(noise) and noise > 0):
                raise ValueError(f"bad corruption {spec!r}: noise's norm must be a finite number > 0")
        elif kind == "replay" and not arg:
            replay = True
        elif kind == "mimic":
            try:
                mimic = float(arg) if arg else 0.0
            except ValueError:
                raise ValueError(
                    f"bad corruption {spec!r}: mimic takes its noise as a multiple of the step, e.g. mimic:1"
                ) from None
            if not (math.isfinite(mimic) and mimic >= 0):
                raise ValueError(f"bad corruption {spec!r}: mimic's noise must be a finite number >= 0")
        elif kind == "keep":
            if not arg.isdigit() or int(arg) < 1:
                raise ValueError(f"bad corruption {spec!r}: keep needs a positive whole number, e.g. keep:30")
            keep = int(arg)
        elif kind == "copy":
            if not arg.isdigit() or int(arg) > 2**31:
                raise ValueError(
                    f"bad corruption {spec!r}: copy needs the rank whose data it holds, e.g. copy:4"
                )
            copy_of = int(arg)
        elif kind == "madeup" and not arg:
            made_up = True
        elif kind == "step" and not arg:
            adds_step = True
        elif kind in ATTACKS:
            try:
                tau = float(arg) if arg else FACTORS[kind]
            except ValueError:
                raise ValueError(f"bad corruption {spec!r}: {kind} takes a factor, e.g. {kind}:1.5") from None
            if not math.isfinite(tau):
                raise ValueError(f"bad corruption {spec!r}: {kind}'s factor must be finite")
            collude = kind
        elif kind == "group":
            ranks = arg.split(",")
            if not arg or not all(r.isdigit() and int(r) <= 2**31 for r in ranks):
                raise ValueError(f"bad corruption {spec!r}: group needs the colluding ranks, e.g. group:1,2")
            group = tuple(sorted({int(r) for r in ranks}))
        else:
            raise ValueError(
                f"unknown corruption {spec!r}; use none, flip:RATIO[:own], backdoor, backdoor:target=LABEL, "
                "scale:FACTOR, count:SAMPLES, noise:NORM, replay, mimic[:NOISE], keep:SAMPLES, copy:RANK, "
                "madeup, step, alie[:TAU] or ipm[:TAU]"
            )
    return Corruption(
        label_flip_ratio=ratio,
        backdoor=backdoor,
        delta_scale=factor,
        flip_own_classes=own,
        declared_samples=declared,
        noise_norm=noise,
        replay=replay,
        mimic=mimic,
        keep=keep,
        copy_of=copy_of,
        made_up=made_up,
        adds_step=adds_step,
        collude=collude,
        collude_factor=tau,
        group=group,
    )


def declared_count(corruption: Corruption | None, true_count: int) -> int:
    """The sample count a participant declares at Join and in its updates: its true count, unless a
    simulated attack (count:N) declares another."""
    return corruption.declared(true_count) if corruption is not None else true_count
