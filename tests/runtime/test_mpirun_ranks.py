"""Rank assignment under a real mpirun: each process gets its block of ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_ranks import PROBE, REPO


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not on PATH (Debian: openmpi-bin)")
def test_real_mpirun_blocks(tmp_path: Path) -> None:
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    command = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "3", sys.executable, "-c", PROBE]
    proc = subprocess.run(
        [*command, str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
    assert sorted(tuple(r["ranks"]) for r in reports) == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
    assert all(r["world_size"] == 9 and r["source"] == "openmpi" for r in reports)
