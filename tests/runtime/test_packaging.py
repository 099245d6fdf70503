"""One real tree: every module under fedsv/ at its import path; the wheel's one top-level name is fedsv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "fedsv")
DESIGN_CARD = ("valuation", "coordinator", "participant")
"""The design card's folders, visible at the root as links into the package."""


def test_every_module_has_one_real_path_and_the_card_folders_link_into_it() -> None:
    package = REPO / "fedsv"
    links = [p for p in package.rglob("*") if p.is_symlink()]
    assert not links, f"links inside the package: {links}"
    for name in DESIGN_CARD:
        root = REPO / name
        assert root.is_symlink() and root.resolve() == (package / name).resolve(), name
        assert (package / name / "__init__.py").is_file()
    # what `find fedsv -name '*.py'` lists is every module the package imports
    found = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    for module in ("valuation/round/round_game.py", "coordinator/round_loop.py", "participant/worker.py"):
        assert module in found, module


@pytest.mark.slow
def test_the_wheel_has_fedsv_as_its_only_top_level_name(tmp_path: Path) -> None:
    # Build from a copy, so the checkout gets no build/ or egg-info of its own.
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    command = [*build, "-w", str(tmp_path / "dist"), str(source)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("fedsv-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["fedsv"]
        entry_points = archive.read(top_level.replace("top_level.txt", "entry_points.txt")).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"fedsv"}
    # The subpackages, the generated code and both entry points.
    for expected in (
        "fedsv/valuation/estimators/api.py",
        "fedsv/coordinator/__main__.py",
        "fedsv/participant/__main__.py",
        "fedsv/wire/v1/fedsv_pb2.py",
        "fedsv/app/cli.py",
    ):
        assert expected in names, expected
    assert "fedsv = fedsv.app.cli:main" in entry_points
