"""Bad tasks, bad data files and bad counts on the command lines: one line each, exit status 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fedsv.coordinator.__main__ as coordinator_main
import fedsv.participant.__main__ as participant_main
from fedsv.app.cli import main as fedsv_main
from tests.support.errors import one_line

TASK = """
from torch import nn
from fedsv.task import Task

class Tiny(Task):
    def build_model(self):
        return nn.Linear(4, 2)

task = Tiny()
"""


@pytest.fixture()
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_task.py"
    path.write_text(TASK)
    return path


@pytest.mark.parametrize(
    ("task", "data", "needles"),
    [
        ("nomodule_qq:x", "", ("no module named 'nomodule_qq'",)),
        ("fedsv.tasks:absent", "", ("has no attribute 'absent'",)),
        ("{task}:task", "{dir}/missing{{rank}}.npz", ("missing0.npz", "no such file")),
        ("{task}:task", "{dir}/bad.npz", ("bad.npz",)),
    ],
)
def test_participant(
    task: str, data: str, needles: tuple[str, ...], task_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (task_file.parent / "bad.npz").write_bytes(b"not a zip archive")
    args = ["--coordinator", "127.0.0.1:1", "--rank", "0", "--world-size", "2", "--insecure"]
    args += ["--task", task.format(task=task_file)]
    if data:
        args += ["--data", data.format(dir=task_file.parent)]
    assert participant_main.main(args) == 2
    one_line(capsys.readouterr().err, "participant: error:", *needles)


def test_coordinator(task_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--state-dir", str(tmp_path / "state"), "--insecure", "--port", "0", "--metrics-port", "-1"]
    base += ["--health-port", "-1", "--participants", "2"]
    assert coordinator_main.main([*base, "--task", "nomodule_qq:x", "--validation-data", "v.npz"]) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", "nomodule_qq")
    assert coordinator_main.main([*base, "--task", f"{task_file}:task"]) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", "validation_data")
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((3, 4), np.float32))  # no y
    argv = [*base, "--task", f"{task_file}:task", "--validation-data", str(wrong)]
    assert coordinator_main.main(argv) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", "wrong.npz", "'y'")
    assert coordinator_main.main([*base, "--max-samples-per-participant", "0"]) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", "max_samples_per_participant")


def test_demo(task_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fedsv_main(["demo", "--task", f"{task_file}:no_such", "--validation-data", "v.npz"]) == 2
    one_line(capsys.readouterr().err, "fedsv demo: error:", "no attribute 'no_such'")


def test_participant_device(task_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--coordinator", "127.0.0.1:1", "--rank", "0", "--world-size", "2", "--insecure"]
    assert participant_main.main([*args, "--device", "tpu"]) == 2
    one_line(capsys.readouterr().err, "participant: error:", "tpu")
