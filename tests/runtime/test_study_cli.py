"""fedsv study: a config file with an unknown key is a one-line error (the real command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_config_file_with_unknown_key_is_one_line_error(tmp_path: Path) -> None:
    config = tmp_path / "study.json"
    config.write_text(json.dumps({"participants": 20, "colour": "blue"}))
    proc = subprocess.run(
        [sys.executable, "-m", "fedsv", "study", "noisy", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown setting 'colour'" in proc.stderr
