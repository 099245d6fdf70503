"""Shared helpers of the deploy/ tests: paths, real tools, free ports, the Dockerfile's instructions."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"


def need_tool(name: str, install_hint: str) -> str:
    """Path of the real tool `name` (the venv's bin first, then PATH); skip without it, fail in CI."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(name, path=search)
    if found is None:
        message = f"{name} is not installed ({install_hint})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must have it")
        pytest.skip(message)
    return found


def need_module(name: str, install_hint: str) -> Any:
    """The imported module `name`; skip without it, fail in CI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        message = f"Python package {name} is not installed ({install_hint})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must have it")
        pytest.skip(message)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def dockerfile_instructions() -> list[tuple[str, tuple[str, ...], tuple[str, ...], bool]]:
    """(instruction, flags, values, JSON form) of every instruction, parsed by BuildKit's own parser."""
    dockerfile = need_module("dockerfile", "pip install dockerfile (in the dev extra)")
    return [
        (c.cmd.upper(), tuple(c.flags), tuple(c.value), bool(c.json))
        for c in dockerfile.parse_file(str(DOCKERFILE))
    ]


def dockerfile_one(instruction: str) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(flags, values, JSON form) of the last `instruction` (the one Docker uses for CMD/HEALTHCHECK/USER)."""
    found = [(f, v, j) for cmd, f, v, j in dockerfile_instructions() if cmd == instruction]
    assert found, f"deploy/Dockerfile has no {instruction}"
    return found[-1]


def healthcheck_argv() -> list[str]:
    """The image's HEALTHCHECK command as argv (exec form: no shell in between)."""
    _, values, json_form = dockerfile_one("HEALTHCHECK")
    assert values[0] == "CMD" and json_form, "HEALTHCHECK must be `CMD [...]` in exec (JSON) form"
    return list(values[1:])


def flag_value(argv: list[str] | tuple[str, ...], flag: str) -> str:
    """The value after `flag` (or of `flag=value`) in argv."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {list(argv)}")
