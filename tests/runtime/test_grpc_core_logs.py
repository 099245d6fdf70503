"""gRPC core's own log lines (one per failed TLS handshake) stay quiet in fedsv's processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PROBE = """
import asyncio, sys
if sys.argv[1] == "fedsv":
    import fedsv.coordinator  # noqa: F401  (what `python -m fedsv.coordinator` imports first)
import grpc
from fedsv.security.tls import server_credentials

async def main() -> None:
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", server_credentials(sys.argv[2]))
    await server.start()
    for _ in range(20):  # plaintext clients: every TLS handshake fails
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                await channel.unary_unary("/x/y")(b"", timeout=1)
            except grpc.RpcError:
                pass
    await server.stop(None)

asyncio.run(main())
"""


def _stderr(which: str, certs: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, which, str(certs)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_failed_handshakes_are_not_logged_once_fedsv_is_imported(tmp_path: Path) -> None:
    from fedsv.security.certs import generate

    generate(tmp_path / "certs", 1)
    if "Handshake failed" not in _stderr("plain", tmp_path / "certs"):  # gRPC's default: a line each
        pytest.skip("this gRPC logs no failed handshake by default: nothing to quiet")
    assert "Handshake failed" not in _stderr("fedsv", tmp_path / "certs")
