"""A traced head that is a plain chain of layers, rebuilt as the nn.Sequential the stacked executor runs."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

RELUS = (F.relu, torch.relu)
FLATTENS = ("view", "reshape", "flatten")


def _is_relu(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in RELUS and not node.kwargs.get("inplace", False)


def _flattens(node: fx.Node, before: Tensor, after: Tensor) -> bool:
    """A reshape that turned (n, *F) into (n, prod F): what nn.Flatten() does, checked on the example."""
    reshape = (node.op == "call_method" and node.target in FLATTENS) or (
        node.op == "call_function" and node.target is torch.flatten
    )
    n = before.shape[0]
    return reshape and tuple(after.shape) == (n, math.prod(before.shape[1:]))


def _layer(module: fx.GraphModule, node: fx.Node, before: Tensor, after: Tensor) -> nn.Module | None:
    """The nn.Module doing what `node` did to `before`, or None."""
    if node.op == "call_module" and len(node.args) == 1 and not node.kwargs:
        return module.get_submodule(str(node.target))
    if _is_relu(node) and len(node.args) == 1:
        return nn.ReLU()
    if _flattens(node, before, after):
        return nn.Flatten()
    return None


def _chain(module: fx.GraphModule) -> list[fx.Node] | None:
    """The graph's nodes between its one input and its output when each feeds only the next."""
    nodes = list(module.graph.nodes)
    if len(nodes) < 2 or nodes[0].op != "placeholder" or nodes[-1].op != "output":
        return None
    for previous, node in itertools.pairwise(nodes):
        if node.all_input_nodes != [previous] or len(previous.users) != 1:
            return None
    if nodes[-1].args[0] is not nodes[-2]:
        return None
    return nodes[1:-1]


class _Recording(fx.Interpreter):
    """torch.fx's own interpreter, keeping every node's output."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.values: dict[fx.Node, object] = {}

    def run_node(self, n: fx.Node) -> object:
        self.values[n] = value = super().run_node(n)
        return value


def _outputs(module: fx.GraphModule, chain: list[fx.Node], x: Tensor) -> list[Tensor]:
    """Every chain node's output on x, in order."""
    recording = _Recording(module)
    recording.run(x)
    outputs = [recording.values[node] for node in chain]
    if not all(isinstance(value, Tensor) for value in outputs):
        raise ValueError("a step of the head does not return one tensor")
    return outputs  # type: ignore[return-value]


def as_chain(module: fx.GraphModule, stem_output: Tensor) -> tuple[nn.Sequential, dict[str, str]] | None:
    """(the head as an nn.Sequential, its tensor names -> the model's), or None when it is not a chain.

    `stem_output` is the stem's output on a few examples; the rebuilt chain must reproduce the graph
    on them and on their first sample alone (a reshape that fixed the batch size would not).
    """
    chain = _chain(module)
    if chain is None:
        return None
    try:
        outputs = _outputs(module, chain, stem_output)
    except Exception:  # a node the interpreter cannot replay: keep the graph
        return None
    layers: list[nn.Module] = []
    names: dict[str, str] = {}
    for index, (node, before, after) in enumerate(zip(chain, [stem_output, *outputs], outputs, strict=False)):
        layer = _layer(module, node, before, after)
        if layer is None:
            return None
        layers.append(layer)
        if node.op == "call_module":
            tensors = [*layer.named_parameters(), *layer.named_buffers()]
            names.update({f"{index}.{rel}": f"{node.target}.{rel}" for rel, _ in tensors})
    sequential = nn.Sequential(*layers)
    for x in (stem_output, stem_output[:1]):
        expected = module(x)
        if not torch.equal(sequential(x), expected):
            return None
    return sequential, names
