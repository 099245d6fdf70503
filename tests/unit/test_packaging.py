"""The wheel: one top-level name, `fedsv`, holding the design card's folders as its subpackages."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "fedsv", "valuation", "coordinator", "participant")


@pytest.mark.slow
def test_the_wheel_has_fedsv_as_its_only_top_level_name(tmp_path: Path) -> None:
    # Build from a copy, links kept as links, so the checkout gets no build/ or egg-info of its own.
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    assert (source / "fedsv" / "valuation").is_symlink()
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
    # The linked folders arrive as real files inside fedsv/, with the generated code and both entry points.
    for expected in (
        "fedsv/valuation/api.py",
        "fedsv/coordinator/__main__.py",
        "fedsv/participant/__main__.py",
        "fedsv/common/v1/fedsv_pb2.py",
        "fedsv/app/cli.py",
    ):
        assert expected in names, expected
    assert "fedsv = fedsv.app.cli:main" in entry_points
