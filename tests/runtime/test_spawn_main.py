"""The valuation process starts without the parent's __main__: an unguarded script is not run twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script(tmp_path: Path, guarded: bool) -> tuple[Path, Path]:
    mark = tmp_path / "mark.txt"
    start = "with without_main():\n    child.start()" if guarded else "child.start()"
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import multiprocessing, sys
            sys.path.insert(0, {str(REPO)!r})
            with open({str(mark)!r}, "a") as handle:
                handle.write("main ran\\n")
            from fedsv.pipeline.valuation_worker import without_main
            child = multiprocessing.get_context("spawn").Process(target=print)
            """
        )
        + start
        + "\nchild.join()\nsys.exit(child.exitcode)\n"
    )
    return script, mark


def test_a_spawned_valuation_process_does_not_run_the_parents_script(tmp_path: Path) -> None:
    script, mark = _script(tmp_path, guarded=True)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert mark.read_text().splitlines() == ["main ran"]


def test_without_it_the_child_runs_the_script_again(tmp_path: Path) -> None:
    """What without_main() prevents: spawn's child re-imports an unguarded main script (and fails)."""
    script, mark = _script(tmp_path, guarded=False)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert mark.read_text().splitlines() == ["main ran", "main ran"]
    assert done.returncode != 0
