"""Flower round time with and without FedSVStrategy, on Flower's deployment engine, in one sitting.

Usage: python benchmarks/bench_flower.py [--nodes 8] [--rounds 4] [--pairs 2] [--busy 0] [--model mlp]

Starts a SuperLink and --nodes SuperNodes on loopback (flwr's own commands, a private FLWR_HOME), then
runs examples/flower --pairs times each way, alternating: `fedsv=false` (Flower's FedAvg alone) and
`fedsv=true` (FedAvg wrapped by FedSVStrategy, valuation in the background). A round's time is the gap
between the "[ROUND k/N]" lines of `flwr run --stream` (the last round ends at "Strategy execution
finished"), stamped as each line arrives. Prints the median round time of each way and their ratio,
the wrapped run's seconds from the end of its last round to the end of its backlog, and where the CPU
went: the machine's CPU seconds per run (/proc/stat, less the spinners' own), and the valuation's own
wall and CPU seconds per round from the wrapped runs' ledgers. --busy N keeps N spinning processes at
normal priority running while Flower's rounds run (a machine whose cores are busy); they stop when the
last round ends, so that the backlog is valued.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fixtures import load_average, machine, print_table

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"
ROUND = re.compile(r"\[ROUND (\d+)/(\d+)\]")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


TICK = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Spinners:
    """N processes spinning at normal priority, started and stopped per run; the CPU they spent."""

    def __init__(self, count: int) -> None:
        self.count, self.spent = count, 0.0
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.processes = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.count)
        ]

    def stop(self) -> None:
        for process in self.processes:
            self.spent += _process_cpu(process.pid)
            process.kill()
            process.wait()
        self.processes = []

    def cpu(self) -> float:
        return self.spent + sum(_process_cpu(p.pid) for p in self.processes)


def _cpu_seconds(spinners: Spinners) -> float:
    """CPU seconds the whole machine has spent busy (/proc/stat: user, nice, system, irq, softirq,
    steal), less what the spinning processes spent."""
    busy = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(busy[i]) for i in (0, 1, 2, 5, 6, 7)) / TICK - spinners.cpu()


def _valuation_seconds(runs: Path) -> tuple[list[float], list[float]]:
    """Each valued round's valuation wall and CPU seconds, from every ledger under `runs`."""
    wall: list[float] = []
    cpu: list[float] = []
    for path in sorted(runs.glob("*/ledger.sqlite")):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            query = "SELECT valuation_seconds, valuation_cpu_seconds FROM rounds WHERE status = 'valued'"
            for seconds, cpu_seconds in conn.execute(query):
                wall.append(seconds)
                cpu.append(cpu_seconds if cpu_seconds is not None else float("nan"))
    return wall, cpu


def _run(
    home: Path,
    ledger: Path,
    rounds: int,
    nodes: int,
    fedsv: bool,
    model: str,
    rounds_done: Callable[[], None],
) -> tuple[list[float], float]:
    """(each round's seconds, seconds from the last round's end to the run's end) of one `flwr run`."""
    config = (
        f"num-server-rounds={rounds} min-available-nodes={nodes} fedsv={'true' if fedsv else 'false'} "
        f"ledger='{ledger}' model='{model}'"
    )
    command = ["flwr", "run", str(APP), "bench", "--stream", "--run-config", config]
    stamps: list[float] = []
    finished = 0.0
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "FLWR_HOME": str(home)},
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            now = time.monotonic()
            if ROUND.search(line):
                stamps.append(now)
            elif "Strategy execution finished" in line:
                finished = now
                rounds_done()
        end = time.monotonic()
    if process.returncode != 0 or len(stamps) != rounds or not finished:
        raise RuntimeError(f"flwr run failed (exit {process.returncode}, {len(stamps)} rounds seen)")
    stamps.append(finished)
    return [b - a for a, b in itertools.pairwise(stamps)], end - finished


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes kept running throughout")
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"), help="the example app's model")
    args = parser.parse_args(argv)
    if shutil.which("flower-superlink") is None:
        print("flwr is not installed (pip install 'fedsv[flower]')", file=sys.stderr)
        return 2
    print(f"command: {' '.join(sys.argv)}\nmachine: {machine()}\nload before: {load_average()}")
    work = Path(tempfile.mkdtemp(prefix="fedsv-bench-flower-"))
    port = _free_port()
    (work / "home").mkdir()
    federation = f'[superlink.bench]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    (work / "home" / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n\n{federation}')
    servers: list[subprocess.Popen[bytes]] = []
    spinners = Spinners(args.busy)
    log = open(work / "servers.log", "wb")  # noqa: SIM115 (closed in finally)
    cpu: dict[str, list[float]] = {"FedAvg": [], "FedSVStrategy(FedAvg)": []}
    try:
        servers.append(
            subprocess.Popen(
                [
                    "flower-superlink",
                    "--insecure",
                    "--disable-runtime-dependency-installation",
                    "--port",
                    str(port),
                ],
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for_port(port, time.monotonic() + 120)
        for i in range(args.nodes):
            node_config = f"partition-id={i} num-partitions={args.nodes}"
            servers.append(
                subprocess.Popen(
                    [
                        "flower-supernode",
                        "--insecure",
                        "--superlink",
                        f"127.0.0.1:{port}",
                        "--port",
                        str(_free_port()),
                        "--node-config",
                        node_config,
                    ],
                    cwd=work,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        rounds: dict[str, list[float]] = {"FedAvg": [], "FedSVStrategy(FedAvg)": []}
        backlog: list[float] = []
        for pair in range(args.pairs):
            for fedsv in (pair % 2 == 1, pair % 2 == 0):  # alternate which way goes first
                before = _cpu_seconds(spinners)
                spinners.start()
                times, tail = _run(
                    work / "home", work / "runs", args.rounds, args.nodes, fedsv, args.model, spinners.stop
                )
                spinners.stop()
                time.sleep(5)  # the run's last processes (ServerApp, ClientApps) end within the CPU count
                name = "FedSVStrategy(FedAvg)" if fedsv else "FedAvg"
                rounds[name].extend(times)
                cpu[name].append(_cpu_seconds(spinners) - before)
                if fedsv:
                    backlog.append(tail)
                print(
                    f"pair {pair + 1}: {'fedsv' if fedsv else 'plain'} rounds "
                    + ", ".join(f"{t:.1f}" for t in times),
                    flush=True,
                )
    finally:
        spinners.stop()
        for server in reversed(servers):
            server.terminate()
        for server in servers:
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        log.close()
    plain = statistics.median(rounds["FedAvg"])
    plain_cpu = statistics.median(cpu["FedAvg"]) / args.rounds
    rows = [
        [
            name,
            str(len(times)),
            f"{statistics.median(times):.2f}",
            f"{statistics.median(times) / plain:.3f}x",
            f"{statistics.median(cpu[name]) / args.rounds:.1f}",
            f"{statistics.median(cpu[name]) / args.rounds / plain_cpu:.3f}x",
        ]
        for name, times in rounds.items()
    ]
    print(
        f"\nFlower {args.nodes} SuperNodes, deployment engine, examples/flower (model {args.model}), "
        f"{args.rounds} rounds x {args.pairs} runs each; {args.busy} spinning processes beside"
    )
    print_table(
        ["strategy", "rounds", "median round s", "vs FedAvg", "machine CPU-s per round", "vs FedAvg"], rows
    )
    wall, valuation_cpu = _valuation_seconds(work / "runs")
    print(
        f"valuation per round (idle-priority process): median {statistics.median(wall):.2f} s wall, "
        f"{statistics.median(valuation_cpu):.2f} CPU-s"
    )
    print(f"wrapped runs: last round's end to the backlog's end, median {statistics.median(backlog):.2f} s")
    print(f"load after: {load_average()}; work files in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
