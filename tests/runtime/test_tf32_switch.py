"""The TF32 switch sets and restores torch's flags, in a fresh process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

import fedsv.valuation.round.device as device_module


def test_tf32_switch_sets_and_restores_the_flags() -> None:
    """tf32_allowed flips both flags and restores them, through the allow_tf32 flags or fp32_precision."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    for allow in (True, False):
        with device_module.tf32_allowed(allow):
            assert (matmul.allow_tf32, cudnn.allow_tf32) == (allow, allow)
        assert (matmul.allow_tf32, cudnn.allow_tf32) == before
    # A process that set TF32 with the newer API cannot read the old flags: run it in its own process.
    script = textwrap.dedent(
        """
        import torch
        from fedsv.valuation.round.device import tf32_allowed
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        torch.backends.fp32_precision = "tf32"
        matmul.fp32_precision = "tf32"
        def state():
            return (matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision)
        before = state()
        for allow in (True, False):
            with tf32_allowed(allow):
                want = "tf32" if allow else "ieee"
                assert (matmul.fp32_precision, cudnn.conv.fp32_precision) == (want, want), state()
            assert state() == before, state()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
