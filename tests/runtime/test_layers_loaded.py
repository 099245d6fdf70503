"""Importing a layer in a fresh interpreter loads only the layers below it (the contract: tests/unit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_layers import (
    ALLOWED,
    LOAD_LAYER,
    NO_GRPC,
    OLD_TOP_LEVEL,
    installed_for,
    layer_of,
    modules_of,
)


def _loaded_after_importing(modules: list[str], where: Path) -> list[str]:
    """sys.modules of a fresh interpreter, started in `where` (outside the checkout), once it has
    imported `modules`."""
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_LAYER, *modules],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded: list[str] = json.loads(proc.stdout)
    return loaded


@pytest.mark.parametrize("layer", list(ALLOWED))
def test_importing_a_layer_loads_only_the_layers_below_it(layer: str, tmp_path: Path) -> None:
    """In a fresh interpreter, outside the checkout: import every module of the layer, read sys.modules."""
    # A module that needs a package installed only on some machines is imported only where it is.
    modules = sorted(name for name in modules_of(layer) if installed_for(name))
    loaded = _loaded_after_importing(modules, tmp_path)
    assert set(modules) <= set(loaded)
    layers = {found for name in loaded if name.startswith("fedsv.") and (found := layer_of(name))}
    extra = layers - {layer, *ALLOWED[layer]}
    assert not extra, f"{layer} pulled in {sorted(extra)}"
    assert not [name for name in loaded if name.split(".")[0] in OLD_TOP_LEVEL]
    if layer in NO_GRPC:
        assert not [name for name in loaded if name.split(".")[0] == "grpc"], f"{layer} loaded grpc"


def test_the_estimators_load_without_torch(tmp_path: Path) -> None:
    """fedsv.valuation.games and .estimators (the games, the estimators and their registry) run on numpy:
    importing all of them in a fresh interpreter loads no torch, though the package's public names
    (RoundGame among them) are there to import."""
    modules = sorted(
        name
        for name in modules_of("fedsv.valuation")
        if name.startswith(("fedsv.valuation.games", "fedsv.valuation.estimators"))
    )
    loaded = set(_loaded_after_importing(modules, tmp_path))
    assert set(modules) <= loaded and "fedsv.valuation.estimators.permutation" in loaded
    assert not {name for name in loaded if name.split(".")[0] == "torch"}
    assert not {name for name in loaded if name.startswith(("fedsv.fl", "fedsv.valuation.round"))}
