"""The Triton kernel under its interpreter, in a fresh process (TRITON_INTERPRET is read as Triton loads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.unit.test_fused_head import REPO, TRITON


@pytest.mark.skipif(not TRITON, reason="Triton is not installed (the dev extra installs it)")
def test_the_kernel_under_tritons_interpreter_scores_like_the_layer_by_layer_head() -> None:
    """No GPU needed: TRITON_INTERPRET=1 runs the kernel on the CPU, in a process of its own."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.interpreted_kernel"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for case in result["random"]:  # against float64: an argmax may flip where two logits nearly tie
        n = case["n"][0]
        kernel, reference = np.array(case["kernel"]), np.array(case["reference"])
        assert kernel.shape == reference.shape  # (coalitions, labels): correct predictions per label
        assert np.abs(kernel - reference).sum(axis=1).max() <= max(1, n // 50)
    kernel, layered = np.array(result["round"]["kernel"]), np.array(result["round"]["layered"])
    assert kernel.shape == (64, 10 * 8) and np.all(kernel.sum(axis=1) > 0)  # (label, fold) cells
    flips = np.abs(kernel - layered).sum(axis=1)  # both fp32 products here: equal, up to a rare tie
    assert flips.max() <= 1 and np.mean(flips > 0) <= 0.05, flips
