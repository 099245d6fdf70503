"""Find a model's linear first layer: parameter-free reshapes, then a Linear or Conv2d, then the rest."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from torch import Tensor, nn

RESHAPES: tuple[type[nn.Module], ...] = (nn.Flatten, nn.Unflatten, nn.Identity)
"""Parameter-free layers that only reshape their input: they may run before the stem, once per round."""

STEMS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
"""First layers whose output is linear in their parameters (for a fixed input)."""


@dataclass(frozen=True)
class StemSplit:
    """model(x) == head(stem(prepare(x))), built from the model's own layers (shared, not copied).

    `stem_names` and `head_names` map a tensor name relative to the stem ("weight") or to the head
    ("2.running_mean") to its name in the model's state ("1.weight", "features.3.running_mean").
    """

    prepare: nn.Module
    stem: nn.Linear | nn.Conv2d
    stem_names: dict[str, str]
    head: nn.Module
    head_names: dict[str, str]
    description: str

    def stem_output_dim(self) -> int:
        """The dimension of the stem's output that indexes its output features (channels for Conv2d)."""
        return 1 if isinstance(self.stem, nn.Conv2d) else -1


class NoSplit(Exception):
    """Why a model has no stem split (a reason for the log)."""


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _check_container(seq: nn.Module, name: str) -> None:
    what = "the model" if not name else f"nested Sequential {name!r}"
    if type(seq).forward is not nn.Sequential.forward:
        raise NoSplit(f"{what} ({type(seq).__name__}) overrides nn.Sequential.forward")
    if _has_hooks(seq):
        raise NoSplit(f"{what} has forward hooks, which a layer-by-layer evaluation would skip")


def _layers(seq: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """(state-dict prefix, layer) of every layer in call order, nested Sequentials flattened."""
    _check_container(seq, prefix.rstrip("."))
    out: list[tuple[str, nn.Module]] = []
    for name, layer in seq._modules.items():  # not named_children(): that skips a module listed twice
        full = f"{prefix}{name}"
        if layer is None:
            raise NoSplit(f"layer {full!r} is None")
        if isinstance(layer, nn.Sequential):
            out.extend(_layers(layer, f"{full}."))
        else:
            out.append((full, layer))
    return out


def _tensors(layer: nn.Module) -> dict[str, Tensor]:
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


def _split(model: nn.Module, state_names: Collection[str]) -> StemSplit:
    if not isinstance(model, nn.Sequential):
        raise NoSplit(f"{type(model).__name__} is not an nn.Sequential")
    params = list(model.named_parameters(remove_duplicate=False))
    if len({id(p) for _, p in params}) != len(params):
        raise NoSplit("the model shares parameters between layers")
    layers = _layers(model, "")
    first = next((i for i, (_, layer) in enumerate(layers) if any(True for _ in layer.parameters())), None)
    if first is None:
        raise NoSplit("the model has no layer with parameters")
    for name, layer in layers[:first]:
        if type(layer) not in RESHAPES:
            raise NoSplit(
                f"layer {name!r} ({type(layer).__name__}) before the first layer with parameters "
                f"is not a known reshape ({', '.join(t.__name__ for t in RESHAPES)})"
            )
    stem_prefix, stem = layers[first]
    if type(stem) not in STEMS:
        raise NoSplit(f"the first layer with parameters, {stem_prefix!r}, is a {type(stem).__name__}")
    assert isinstance(stem, nn.Linear | nn.Conv2d)
    if isinstance(stem, nn.Conv2d) and stem.groups != 1:
        # the deltas are stacked along the output channels: groups=1 only
        raise NoSplit(f"the first layer {stem_prefix!r} is a grouped Conv2d (groups={stem.groups})")
    if _has_hooks(stem):
        raise NoSplit(f"the first layer {stem_prefix!r} has forward hooks")
    stem_names = {rel: f"{stem_prefix}.{rel}" for rel in _tensors(stem)}
    head_layers = layers[first + 1 :]
    head_names = {
        f"{index}.{rel}": f"{prefix}.{rel}"
        for index, (prefix, layer) in enumerate(head_layers)
        for rel in _tensors(layer)
        if f"{prefix}.{rel}" in state_names
    }
    covered = set(stem_names.values()) | set(head_names.values())
    if not set(stem_names.values()) <= set(state_names) or covered != set(state_names):
        raise NoSplit("the layers' tensor names do not match the model's state")
    reshapes = "".join(f"{type(layer).__name__} -> " for _, layer in layers[:first])
    description = f"{reshapes}{type(stem).__name__} {stem_prefix!r} -> a head of {len(head_layers)} layers"
    return StemSplit(
        nn.Sequential(*(layer for _, layer in layers[:first])),
        stem,
        stem_names,
        nn.Sequential(*(layer for _, layer in head_layers)),
        head_names,
        description,
    )


def split_stem(model: nn.Module, state_names: Collection[str]) -> tuple[StemSplit | None, str]:
    """The model's split into prepare -> stem -> head, or None, and a reason either way (for the log).

    A model qualifies when it is an nn.Sequential (nested Sequentials flattened; none may override
    forward or carry forward hooks) whose first layer with parameters is an nn.Linear or an nn.Conv2d
    with groups == 1, preceded only by RESHAPES. `state_names` are the model's federated tensors
    (parameters and floating-point buffers); every one must belong to the stem or the head.
    """
    try:
        split = _split(model, state_names)
    except NoSplit as reason:
        return None, str(reason)
    return split, split.description
