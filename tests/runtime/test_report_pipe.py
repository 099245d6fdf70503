"""fedsv report into a pipe its reader closes early: it ends quietly (a real process)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_report import made_up_run


def test_report_into_a_pipe_closed_early_ends_quietly(tmp_path: Path) -> None:
    """`fedsv report RUN | head -1`: no "Broken pipe" error or traceback, the SIGPIPE exit status."""
    import os
    import subprocess
    import sys

    directory, _ = made_up_run(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write meets a closed pipe
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fedsv", "report", str(directory)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == "" and done.returncode == 141
