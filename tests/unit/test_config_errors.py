"""Wrong settings in flags and config files: a one-line error naming the setting, exit status 2."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import fedsv.coordinator.__main__ as coordinator_main
from fedsv.app.cli import main as fedsv_main
from tests.support.errors import one_line


@pytest.mark.parametrize(
    ("settings", "needles"),
    [
        ({"participants": "six"}, ("participants must be a whole number", "'six'")),
        ({"fraction": "half"}, ("fraction must be a number", "'half'")),
        ({"round_timeout": [120]}, ("round_timeout must be a number",)),
        ({"insecure": "maybe"}, ("insecure must be true or false", "'maybe'")),
        ({"rounds": 2.5}, ("rounds must be a whole number", "2.5")),
        ({"rounds": True}, ("rounds must be a number, got True",)),
        ({"lr": False}, ("lr must be a number, got False",)),
        ({"port": 70000}, ("port must be a whole number in 0..65535", "70000")),
        ({"metrics_port": -2}, ("metrics_port must be a whole number in -1..65535",)),
        ({"epochs": 0}, ("epochs must be a whole number in 1..2147483647",)),
        ({"lr": -0.1}, ("lr must be a positive finite number",)),
        ({"update_norm_policy": "ignore"}, ("update_norm_policy must be one of",)),
        ({"update_norm_reject_multiple": 0.5}, ("update_norm_reject_multiple must be at least 1",)),
        ({"eps": 0}, ("eps must be a positive finite number",)),
        ({"header_timeout": 0}, ("header_timeout must be in (0, 100000000]",)),
        ({"header_timeout": "ten"}, ("header_timeout must be a number",)),
        ({"max_participants": -1}, ("max_participants must be a whole number in 0..",)),
        ({"participants": "x" * 5000}, ("participants must be a whole number", "...")),
    ],
)
def test_coordinator_config_file(tmp_path: Path, settings: dict[str, object], needles: tuple[str, ...],
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "health_port": -1, **settings}))
    assert coordinator_main.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    one_line(err, "coordinator: error:", *needles)
    assert len(err) < 400  # a hostile value is cut short, not echoed whole
    assert not (tmp_path / "state" / "ledger.sqlite").exists()  # refused before anything is recorded


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--epochs", "0"], "epochs must be a whole number in 1.."),
        (["--batch-size", "0"], "batch_size must be a whole number in 1.."),
        (["--lr", "nan"], "lr must be a positive finite number"),
        (["--lr", "inf"], "lr must be a positive finite number"),
        (["--metrics-port", "70000"], "metrics_port must be a whole number in -1..65535"),
        (["--valuation-budget", "1"], "valuation_budget must be 0 or at least 2"),
        (["--threads", "-2"], "threads must be a whole number in 0..4096"),
        (["--device", "tpu"], "device: unknown device 'tpu'"),
        (["--metric", "f1"], "metric must be one of 'accuracy' or 'neg_loss'"),
        (["--validation-from", "val"], "validation_from must be one of 'train' or 'test'"),
        (["--validation-from", "test"], "validation_from must be train for the embedded sample"),
        (["--test-size", "-1"], "test_size must be a whole number in 0.."),
        (["--test-size", "0"], "test_size must be at least 1 for the embedded sample"),
        (["--update-norm-reject-multiple", "nan"], "update_norm_reject_multiple must be at least 1"),
    ],
)
def test_launch_flags(
    tmp_path: Path, flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fedsv_main(["launch", "--out", str(tmp_path / "run"), *flags]) == 2
    one_line(capsys.readouterr().err, "fedsv launch: error:", needle)
    assert not (tmp_path / "run" / "ledger.sqlite").exists()


def test_missing_data_busy_port_and_a_file_for_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--state-dir", str(tmp_path / "state"), "--insecure", "--port", "0", "--health-port", "-1"]
    argv = [*base, "--metrics-port", "-1", "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere")]
    assert coordinator_main.main(argv) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", "nowhere", "does not exist")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [*base, "--host", "127.0.0.1", "--metrics-port", str(port), "--rounds", "1"]
        assert coordinator_main.main(argv) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", f"metrics_port on 127.0.0.1:{port}")
    a_file = tmp_path / "certs"
    a_file.write_text("")
    assert fedsv_main(["certs", "--out", str(a_file), "--participants", "2"]) == 2
    one_line(capsys.readouterr().err, "fedsv certs: error:", "is a file")
