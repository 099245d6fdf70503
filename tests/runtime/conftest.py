"""Session fixtures shared by test modules: the undisturbed reference run of the fault tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.runtime import FAULT_RUN, launch, ledger_digest, tail


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Any, ...]]]:
    """Ledger digest of FAULT_RUN launched without any fault: what a disturbed run must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = launch(out, {**FAULT_RUN, "linger": 0})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + tail(out / "coordinator.log")
    digest = ledger_digest(out)
    assert [r[0] for r in digest["rounds"]] == list(range(1, int(str(FAULT_RUN["rounds"])) + 1))
    return digest
