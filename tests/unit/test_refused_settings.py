"""Settings, files and data that used to break a run late: refused up front in one line, nothing recorded."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import fedsv.coordinator.__main__ as coordinator_main
import fedsv.participant.__main__ as participant_main
from fedsv.app.cli import main as fedsv_main
from fedsv.security.certs import generate
from tests.support.errors import one_line

TASK = """
from torch import nn
from fedsv.task import Task


class Tiny(Task):
    label = "y"

    def build_model(self):
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


task = Tiny()
"""


def _coordinator(tmp_path: Path, *flags: str) -> list[str]:
    base = ["--state-dir", str(tmp_path / "state"), "--port", "0", "--health-port", "-1"]
    return [*base, "--metrics-port", "-1", *flags]


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    assert coordinator_main.main(argv) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", *needles)
    assert not (tmp_path / "state" / "ledger.sqlite").exists()  # refused before anything is recorded


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--seed", "100000000000000"], "seed must be a whole number in 0..4294967295"),
        (["--round-timeout", "1e300"], "round_timeout must be in (0, 100000000]"),
        (["--join-timeout", "inf"], "join_timeout must be in (0, 100000000]"),
        (["--rounds", "3000000000"], "rounds must be a whole number in 1..2147483647"),
        (["--participants", "3000000000"], "participants must be a whole number in 1..2147483647"),
        (["--epochs", "3000000000"], "epochs must be a whole number in 1..2147483647"),
        (["--batch-size", "3000000000"], "batch_size must be a whole number in 1..2147483647"),
        (["--max-samples-per-participant", str(2**63)], "max_samples_per_participant must be a whole number"),
        (
            ["--participants", "6", "--aggregation", "krum", "--aggregation-byzantine", "100"],
            "aggregation_byzantine must be at most 0 with 3 selected per round",
        ),
        (
            [
                "--participants",
                "6",
                "--aggregation",
                "multi_krum",
                "--aggregation-byzantine",
                "0",
                "--aggregation-keep",
                "9",
            ],
            "aggregation_keep must be at most the 3 selected",
        ),
        (["--update-count-multiple", "0.5"], "update_count_multiple must be 0 (off) or >= 1"),
    ],
)
def test_out_of_range_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    _refused(tmp_path, capsys, _coordinator(tmp_path, "--insecure", *flags), needle)


def test_transport_files_ports_and_hosts_are_checked_before_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(
        tmp_path, capsys, _coordinator(tmp_path, "--tls-dir", str(tmp_path / "nowhere")), "does not exist"
    )
    certs = tmp_path / "certs"
    generate(certs, 2)
    (certs / "coordinator.pem").write_text("garbage\n")
    _refused(tmp_path, capsys, _coordinator(tmp_path, "--tls-dir", str(certs)), "is not a PEM certificate")
    generate(certs, 2)
    (certs / "coordinator.key").write_bytes((certs / "p000.key").read_bytes())
    _refused(tmp_path, capsys, _coordinator(tmp_path, "--tls-dir", str(certs)), "does not belong to")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("this is not a tokens file\n")
    generate(certs, 2)
    argv = _coordinator(
        tmp_path, "--tls-dir", str(certs), "--no-tls-client-auth", "--tokens-file", str(tokens)
    )
    _refused(tmp_path, capsys, argv, "tokens")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [*_coordinator(tmp_path, "--insecure", "--host", "127.0.0.1"), "--port", str(port)]
        _refused(tmp_path, capsys, argv, f"cannot bind gRPC to 127.0.0.1:{port}")
    _refused(
        tmp_path,
        capsys,
        _coordinator(tmp_path, "--insecure", "--host", "no.such.host.invalid"),
        "cannot bind",
    )
    argv = [*_coordinator(tmp_path, "--insecure"), "--port-file", str(tmp_path)]
    _refused(tmp_path, capsys, argv, "port_file must be a file, not a directory")
    argv = [*_coordinator(tmp_path, "--insecure"), "--port-file", str(tmp_path / "no" / "dir" / "port")]
    _refused(tmp_path, capsys, argv, "port_file must be a file in an existing directory")


def test_bad_log_level_and_certificate_validity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        coordinator_main.main(_coordinator(tmp_path, "--insecure", "--log-level", "LOUD"))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --log-level: invalid choice: 'LOUD'" in err.strip().splitlines()[-1]
    assert "Traceback" not in err and not (tmp_path / "state").exists()
    assert (
        fedsv_main(["certs", "--out", str(tmp_path / "c"), "--participants", "2", "--days", "100000000"]) == 2
    )
    one_line(capsys.readouterr().err, "fedsv certs: error:", "days must be a whole number in 1..36500")


def _task_files(tmp_path: Path) -> Path:
    task = tmp_path / "task.py"
    task.write_text(TASK)
    rng = np.random.default_rng(0)

    def table(name: str, features: int, labels: np.ndarray) -> None:
        x = rng.normal(size=(len(labels), features))
        header = ",".join([*(f"f{i}" for i in range(features)), "y"])
        rows = [",".join([*(f"{v:.4f}" for v in xi), str(int(yi))]) for xi, yi in zip(x, labels, strict=True)]
        (tmp_path / name).write_text("\n".join([header, *rows]) + "\n")

    table("good.csv", 4, rng.integers(0, 3, 40))
    table("labels.csv", 4, np.array([0, 1, 2, 7] * 10))
    table("wide.csv", 5, rng.integers(0, 3, 40))
    return task


@pytest.mark.parametrize(
    ("validation", "needles"),
    [
        ("labels.csv", ("10 validation labels are 3 or more (largest 7)", "predicts 3 classes")),
        ("wide.csv", ("validation data's features of shape (5,) do not fit the model",)),
    ],
)
def test_validation_data_the_model_cannot_take_is_refused_at_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], validation: str, needles: tuple[str, ...]
) -> None:
    task = _task_files(tmp_path)
    argv = _coordinator(
        tmp_path, "--insecure", "--task", f"{task}:task", "--validation-data", str(tmp_path / validation)
    )
    _refused(tmp_path, capsys, argv, *needles)


@pytest.mark.parametrize(
    ("data", "needle"),
    [("labels.csv", "training labels are 3 or more"), ("wide.csv", "features of shape (5,) do not fit")],
)
def test_a_participant_refuses_its_own_file_before_it_joins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str, needle: str
) -> None:
    task = _task_files(tmp_path)
    argv = ["--coordinator", "127.0.0.1:1", "--rank", "0", "--world-size", "2", "--insecure"]
    argv += ["--task", f"{task}:task", "--data", str(tmp_path / data)]
    assert participant_main.main(argv) == 2
    one_line(capsys.readouterr().err, "participant: error:", needle)


@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("nonsense", "coordinator must be HOST:PORT"),
        ("localhost:70000", "port in 1..65535"),
        (":50051", "HOST"),
    ],
)
def test_a_participant_refuses_a_coordinator_address_it_cannot_dial(
    capsys: pytest.CaptureFixture[str], address: str, needle: str
) -> None:
    argv = ["--coordinator", address, "--rank", "0", "--world-size", "2", "--insecure"]
    assert participant_main.main(argv) == 2
    one_line(capsys.readouterr().err, "participant: error:", needle)


def test_a_foreign_sqlite_file_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    foreign = state / "ledger.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE mine (a INTEGER)")
    before = foreign.read_bytes()
    assert coordinator_main.main(_coordinator(tmp_path, "--insecure")) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", "not a fedsv ledger")
    assert foreign.read_bytes() == before and not (state / "ledger.sqlite-wal").exists()
    with sqlite3.connect(foreign) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_a_participant_says_when_it_gives_up(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens once it is closed
    argv = ["--coordinator", f"127.0.0.1:{port}", "--rank", "0", "--world-size", "2", "--insecure"]
    with caplog.at_level("ERROR"):
        assert participant_main.main([*argv, "--give-up-after", "1"]) == 1
    gave_up = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert gave_up and f"127.0.0.1:{port} unreachable" in gave_up[0] and gave_up[0].startswith("rank 0")


def test_a_resuming_coordinator_refuses_a_damaged_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    ledger = state / "ledger.sqlite"
    with sqlite3.connect(ledger) as conn:  # a fedsv-looking file with a damaged page
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("CREATE TABLE filler (x BLOB)")
        conn.executemany("INSERT INTO filler VALUES (?)", [(bytes(3000),) for _ in range(40)])
    raw = bytearray(ledger.read_bytes())
    raw[3 * 4096 : 4 * 4096] = b"\x5a" * 4096
    ledger.write_bytes(bytes(raw))
    assert coordinator_main.main(_coordinator(tmp_path, "--insecure")) == 2
    one_line(capsys.readouterr().err, "coordinator: error:", str(ledger), "damaged")
