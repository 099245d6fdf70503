"""tests/unit starts no process: a test that tries fails at once (such tests belong in tests/runtime)."""

from __future__ import annotations

import multiprocessing.process
import subprocess
from typing import Any

import pytest


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("tests/unit starts no process: move this test to tests/runtime")


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
