"""The `fedsv demo` command end to end, its config handling and its determinism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsv.app.cli import main
from fedsv.app.demo import DemoConfig, run_demo

SMALL = [
    "--participants",
    "4",
    "--fraction",
    "0.75",
    "--rounds",
    "2",
    "--epochs",
    "1",
    "--validation-size",
    "200",
]


def test_demo_subprocess_prints_rounds_and_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fedsv", "demo", *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "round   1  selected   3" in out and "round   2" in out
    assert "exact" in out and "FedSV norm" in out
    # one table row per participant that was ever selected
    rows = [line for line in out.splitlines() if line.strip().split(" ")[-1:] and " p00" in line]
    assert 3 <= len(rows) <= 4


def test_demo_is_deterministic_and_group_rational() -> None:
    config = DemoConfig(participants=4, fraction=0.75, rounds=2, epochs=1, validation_size=200)
    first, second = run_demo(config), run_demo(config)
    assert first.accuracies == second.accuracies
    for a, b in zip(first.valuation.per_round(), second.valuation.per_round(), strict=True):
        assert a.participants == b.participants
        np.testing.assert_array_equal(a.fedsv, b.fedsv)
        np.testing.assert_array_equal(a.loo, b.loo)
        assert abs(a.group_rationality_residual) < 1e-9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--participants", "0"], "participants must be a whole number in 1.."),
        (["demo", "--fraction", "1.5"], "fraction must be in (0, 1]"),
        (["demo", "--corruption", "bogus"], "corruption"),
        (["demo", "--dataset", "mnist"], "data_dir"),
    ],
)
def test_demo_bad_input_is_one_line_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsv demo: error:") and "\n" not in err
    assert message in err


def test_config_file_is_overridden_by_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "participants": 3,
                "fraction": 1.0,
                "rounds": 1,
                "epochs": 1,
                "validation_size": 100,
                "valuation": "permutation",
            }
        )
    )
    assert main(["demo", "--config", str(config), "--valuation", "exact"]) == 0
    out = capsys.readouterr().out
    assert "3 participants, 3 per round, 1 rounds" in out and "valuation=exact" in out

    config.write_text(json.dumps({"participants": 3, "bogus": 1}))
    assert main(["demo", "--config", str(config)]) == 2
    assert "unknown setting 'bogus'" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-line messages are for what the user can fix; anything else is raised with its traceback."""

    def broken(args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr("fedsv.app.cli.main_report", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["report", "somewhere"])
