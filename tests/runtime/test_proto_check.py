"""The generated protobuf code's check command passes on the committed code (a real process)."""

from __future__ import annotations

import subprocess
import sys

from fedsv.wire import protogen


def test_check_command_passes_on_committed_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fedsv.wire.protogen", "--check"],
        cwd=protogen.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
