"""The import contract: every fedsv package imports only the packages below it (docs/architecture.md)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import fedsv

PACKAGE = Path(fedsv.__file__).parent
# Each layer and the layers it may import (besides itself), bottom up.
ALLOWED: dict[str, set[str]] = {
    "fedsv.config": set(),
    "fedsv.fl": set(),
    "fedsv.valuation": {"fedsv.fl"},
    "fedsv.data": {"fedsv.fl"},
    "fedsv.task": {"fedsv.fl", "fedsv.data"},
    "fedsv.wire": {"fedsv.fl"},
    "fedsv.security": {"fedsv.fl"},
    "fedsv.ledger": {"fedsv.fl", "fedsv.valuation"},
    "fedsv.pipeline": {"fedsv.fl", "fedsv.valuation", "fedsv.ledger"},
    # every setting's one declaration, and the run's settings built from them (no gRPC: protobuf only)
    "fedsv.settings": {
        "fedsv.config",
        "fedsv.fl",
        "fedsv.valuation",
        "fedsv.data",
        "fedsv.task",
        "fedsv.wire",
    },
    "fedsv.coordinator": {
        "fedsv.config",
        "fedsv.fl",
        "fedsv.valuation",
        "fedsv.data",
        "fedsv.task",
        "fedsv.wire",
        "fedsv.security",
        "fedsv.ledger",
        "fedsv.pipeline",
        "fedsv.settings",
    },
    "fedsv.participant": {
        "fedsv.settings",
        "fedsv.config",
        "fedsv.fl",
        "fedsv.data",
        "fedsv.task",
        "fedsv.wire",
        "fedsv.security",
    },
}
ALLOWED["fedsv.app"] = {*ALLOWED["fedsv.coordinator"], "fedsv.coordinator", "fedsv.participant"}
# Beside fedsv.coordinator: other frameworks' servers valuing with fedsv, through the same round pipeline.
ALLOWED["fedsv.integrations"] = {*ALLOWED["fedsv.pipeline"], "fedsv.pipeline", "fedsv.task", "fedsv.data"}
ALLOWED["fedsv.integrations"] |= {"fedsv.config", "fedsv.wire"}
# Public modules at the top of the package that belong to a layer: the built-in tasks are the task layer's.
PUBLIC = {"fedsv.tasks": "fedsv.task"}
# What an installed fedsv must never leave behind: the design card's folders as top-level modules.
OLD_TOP_LEVEL = ("valuation", "coordinator", "participant")
NO_GRPC = ("fedsv.fl", "fedsv.valuation", "fedsv.data", "fedsv.task", "fedsv.ledger", "fedsv.pipeline")
"""Layers usable without gRPC: the FL core, the valuation library, data, tasks, the ledger and the round
pipeline."""


def layer_of(module: str) -> str | None:
    """The layer a fedsv module belongs to; None for the fedsv package itself (fedsv, fedsv.__main__)."""
    parts = module.split(".")
    head = ".".join(parts[:2])
    if head in PUBLIC:
        return PUBLIC[head]
    return head if len(parts) >= 2 and head in ALLOWED else None


OPTIONAL = {
    "fedsv.valuation.round.executors.fused_head_kernel": "triton",
    "fedsv.integrations.flower": "flwr",
}
"""Modules (and packages, with all they hold) that import a package only some machines have (Triton
comes with CUDA builds of torch; flwr with the flower extra)."""


def installed_for(module: str) -> bool:
    """False when the module, or a package it lies in, needs an optional package this machine lacks."""
    parts = module.split(".")
    needs = [OPTIONAL[name] for i in range(len(parts)) if (name := ".".join(parts[: i + 1])) in OPTIONAL]
    return all(importlib.util.find_spec(package) is not None for package in needs)


def modules_of(layer: str) -> dict[str, Path]:
    """Every module of a layer by name, found by walking its folder."""
    root = PACKAGE / layer.split(".")[1]
    paths = sorted(root.rglob("*.py"))
    paths += [PACKAGE / f"{name.split('.')[1]}.py" for name, owner in PUBLIC.items() if owner == layer]
    out: dict[str, Path] = {}
    for path in paths:
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = ["fedsv", *rel.parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_names(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in the file, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


@pytest.mark.parametrize("layer", list(ALLOWED))
def test_every_import_statement_respects_the_layers(layer: str) -> None:
    """Statically, lazy imports inside functions included."""
    bad = []
    modules = modules_of(layer)
    assert modules, f"no modules found for {layer}"
    for module, path in modules.items():
        for line, name in imported_names(module, path):
            top = name.split(".")[0]
            target = layer_of(name)
            if top in OLD_TOP_LEVEL:
                bad.append(f"{path}:{line} imports the top-level {name}")
            elif top == "fedsv" and target is None and name != "fedsv":
                bad.append(f"{path}:{line} imports {name}, which is in no layer")
            elif target is not None and target != layer and target not in ALLOWED[layer]:
                bad.append(f"{path}:{line}: {layer} must not import {name}")
            elif layer in NO_GRPC and top == "grpc":
                bad.append(f"{path}:{line}: {layer} imports gRPC")
    assert not bad, "\n".join(bad)


LOAD_LAYER = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_library_entry_point() -> None:
    """`from fedsv.valuation import shapley_values` is the documented entry point, and it works."""
    from fedsv.valuation import ValuationSpec, shapley_values

    result = shapley_values(lambda s: float(len(s) ** 2), m=4, spec=ValuationSpec(method="exact"))
    assert result.method == "exact"
    assert result.values.tolist() == pytest.approx([4.0] * 4)  # symmetric: U(all) = 16 split four ways


def test_every_package_of_fedsv_is_a_layer() -> None:
    """A new package cannot slip past the contract: each folder and top-level module belongs to a layer."""
    owners = {f"fedsv.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    owners |= {f"fedsv.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert not {name for name in owners if layer_of(name) is None}
