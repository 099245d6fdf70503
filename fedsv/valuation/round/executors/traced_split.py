"""Find the linear stem of any nn.Module by tracing it (torch.fx): what runs before it, it, and the rest.

A model's forward is traced once, in eval mode, into a graph. The stem is the first layer with
parameters it calls; it qualifies when it is an nn.Linear or an nn.Conv2d with groups == 1 called on
one tensor, when everything computed before it uses neither parameters nor buffers (flatten, view,
scaling by a constant, a ReLU: run once per round), and when the rest of the forward sees the input
only through the stem's output. The graph is then cut in two GraphModules that share the model's
layers: `prepare` (input -> the stem's input) and `head` (the stem's output -> logits). A head that
is a plain chain of layers the stacked executor implements is rebuilt as an nn.Sequential
(head_chain), so it runs by batched matmul; any other head runs under vmap.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import fx, nn

from fedsv.valuation.round.executors.head_chain import as_chain
from fedsv.valuation.round.executors.stem_split import STEMS, NoSplit, StemSplit, split_stem


def _hooked(model: nn.Module) -> str | None:
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return f"module {name or type(model).__name__!r} has forward hooks, which a trace would skip"
    return None


def _trace(model: nn.Module) -> fx.GraphModule:
    """The model's forward as a graph, traced in eval mode (what a round game evaluates)."""
    was_training = model.training
    model.eval()
    try:
        return fx.symbolic_trace(model)
    except Exception as exc:  # any trace failure (data-dependent control flow, ...) means: no split
        message = " ".join(str(exc).split())[:160]
        raise NoSplit(
            f"torch.fx cannot trace {type(model).__name__} ({type(exc).__name__}: {message})"
        ) from exc
    finally:
        model.train(was_training)


def _stateful(module: nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def _stem_node(traced: fx.GraphModule) -> fx.Node:
    """The first node that touches a parameter or buffer; it must be a call of a Linear or Conv2d."""
    for node in traced.graph.nodes:
        if node.op == "get_attr":
            raise NoSplit(f"the forward reads {node.target!r} directly before any layer with parameters")
        if node.op != "call_module":
            continue
        module = traced.get_submodule(str(node.target))
        if not _stateful(module):
            continue
        if type(module) not in STEMS:
            raise NoSplit(f"the first layer with parameters, {node.target!r}, is a {type(module).__name__}")
        if isinstance(module, nn.Conv2d) and module.groups != 1:
            raise NoSplit(f"the first layer {node.target!r} is a grouped Conv2d (groups={module.groups})")
        if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
            raise NoSplit(f"the first layer {node.target!r} is called with more than one tensor")
        return node
    raise NoSplit("the model has no layer with parameters")


def _before(stem: fx.Node) -> list[fx.Node]:
    """The nodes the stem's input is computed from (its ancestors), in graph order."""
    seen: set[fx.Node] = set()
    todo = [stem.args[0]]
    while todo:
        node = todo.pop()
        if isinstance(node, fx.Node) and node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return [node for node in stem.graph.nodes if node in seen]


def _cut(traced: fx.GraphModule, stem: fx.Node) -> tuple[fx.GraphModule, fx.GraphModule]:
    placeholders = [node for node in traced.graph.nodes if node.op == "placeholder"]
    if len(placeholders) != 1:
        raise NoSplit(f"the forward takes {len(placeholders)} inputs, not one")
    before = _before(stem)
    inside = set(before)
    if placeholders[0] not in inside:
        raise NoSplit("the first layer's input does not depend on the model's input")
    for node in before:
        outside = [user.name for user in node.users if user not in inside and user is not stem]
        if outside:
            raise NoSplit(f"{node.name!r}, computed before the first layer, is also used by {outside[0]!r}")
    stem_input = stem.args[0]
    assert isinstance(stem_input, fx.Node)  # _stem_node checked it
    prepare_graph, env = fx.Graph(), dict[fx.Node, fx.Node]()
    for node in before:
        env[node] = prepare_graph.node_copy(node, lambda n: env[n])
    prepare_graph.output(env[stem_input])
    head_graph = fx.Graph()
    head_env = {stem: head_graph.placeholder("stem_output")}
    for node in traced.graph.nodes:
        if node not in inside and node is not stem:
            head_env[node] = head_graph.node_copy(node, lambda n: head_env[n])
    return fx.GraphModule(traced, prepare_graph), fx.GraphModule(traced, head_graph)


def trace_split(model: nn.Module, state_names: Collection[str], example: torch.Tensor) -> StemSplit:
    """The model's split found by tracing, checked on `example` (a few validation samples); NoSplit with
    the reason otherwise."""
    hooked = _hooked(model)
    if hooked is not None:
        raise NoSplit(hooked)
    traced = _trace(model)
    stem_node = _stem_node(traced)
    stem = traced.get_submodule(str(stem_node.target))
    assert isinstance(stem, nn.Linear | nn.Conv2d)
    prepare, cut_head = _cut(traced, stem_node)
    head: nn.Module = cut_head
    for module in prepare.modules():
        if module is not prepare and _stateful(module):
            raise NoSplit(f"{type(module).__name__} before the first layer holds parameters or buffers")
    stem_names = {rel: f"{stem_node.target}.{rel}" for rel, _ in stem.named_parameters()}
    stem_names.update({rel: f"{stem_node.target}.{rel}" for rel, _ in stem.named_buffers()})
    head_tensors = {**dict(cut_head.named_parameters()), **dict(cut_head.named_buffers())}
    head_names = {name: name for name in head_tensors if name in state_names}
    stem_ids = {id(t) for t in stem.parameters()}
    if any(id(t) in stem_ids for t in head_tensors.values()):
        raise NoSplit("the first layer's parameters are used again after it")
    if set(stem_names.values()) | set(head_names.values()) != set(state_names):
        raise NoSplit("the traced layers' tensors do not match the model's state")
    with torch.no_grad():
        chain = as_chain(cut_head, stem(prepare(example)))
    description = (
        f"traced: {type(stem).__name__} {stem_node.target!r} after {len(prepare.graph.nodes) - 2} "
        f"parameter-free steps -> a head of {len(cut_head.graph.nodes) - 2} steps"
    )
    if chain is not None:
        head, names = chain
        head_names = {rel: name for rel, name in names.items() if name in state_names}
        description += " (a layer chain)"
    with torch.no_grad():
        split = StemSplit(prepare, stem, stem_names, head, head_names, description)
        expected, got = model(example), split.head(split.stem(split.prepare(example)))
    if expected.shape != got.shape or not torch.allclose(expected, got, rtol=1e-4, atol=1e-5):
        raise NoSplit(f"the traced split of {type(model).__name__} does not reproduce its output")
    return split


def find_stem(
    model: nn.Module, state_names: Collection[str], example: torch.Tensor
) -> tuple[StemSplit | None, str]:
    """The model's split, or None, and a reason either way (for the log): an nn.Sequential's layer chain
    (split_stem) where it qualifies, otherwise the traced split (trace_split) checked on `example`."""
    split, why = split_stem(model, state_names)
    if split is not None:
        return split, why
    try:
        split = trace_split(model, state_names, example)
    except NoSplit as reason:
        traced = str(reason)
        return None, f"{why}; traced, {traced}" if isinstance(model, nn.Sequential) else traced
    return split, split.description
