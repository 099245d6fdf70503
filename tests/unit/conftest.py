"""tests/unit starts no process: a test that tries fails at once (such tests belong in tests/runtime)."""

from __future__ import annotations

import multiprocessing.process
import subprocess
import sys
from typing import Any

import pytest

_POPEN_INIT = subprocess.Popen.__init__


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("tests/unit starts no process: move this test to tests/runtime")


def _from_triton() -> bool:
    """Whether Triton is the caller: its CUDA driver and compiler run `ldconfig -p` and `ptxas`."""
    frame = sys._getframe(2)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("triton."):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _popen(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    if not _from_triton():
        _refuse()
    _POPEN_INIT(self, *args, **kwargs)


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
