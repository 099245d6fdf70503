"""Load: one coordinator holding hundreds of participants (many ranks per process); where it breaks.

Usage: python benchmarks/bench_load.py [--participants 100,200,400,800] [--fraction 0.1] [--rounds 3]
                                       [--ranks-per-process 100] [--valuation loo] [--max-seconds 600]

For each N, one real `fedsv launch` run (coordinator + ceil(N / ranks-per-process) participant
processes on loopback, the paper's MLP, C = 0.1, one local epoch) while this script samples the
coordinator process from /proc every 0.1 s and scrapes its metrics endpoint. Prints one table, the
sizes side by side: participants held (the coordinator's `fedsv_participants_connected` peak), time
until all had joined, median round latency and its parts, coordinator CPU seconds per round, peak
RSS (VmHWM) and threads. N grows until a run fails or passes --max-seconds: that is where it breaks.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedsv.app.launch import Launch, LaunchConfig
from fedsv.coordinator.config import RunConfig
from fedsv.coordinator.ledger import Ledger, RoundRecord

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """What /proc and the metrics endpoint said about the coordinator, kept as running maxima."""

    peak_rss_mib: float = 0.0
    threads: int = 0
    connected: int = 0
    cpu_at_round: dict[int, float] = field(default_factory=dict)
    cpu_seconds: float = 0.0


def read_proc(pid: int, sample: Sample) -> None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # the process has exited
        return
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "VmHWM":
            sample.peak_rss_mib = max(sample.peak_rss_mib, int(value.split()[0]) / 1024)
        elif key == "Threads":
            sample.threads = max(sample.threads, int(value))
    fields = stat.rsplit(")", 1)[1].split()
    sample.cpu_seconds = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def read_connected(metrics_port: int, sample: Sample) -> None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1) as reply:
            text = reply.read().decode()
    except OSError:
        return
    for line in text.splitlines():
        if line.startswith("fedsv_participants_connected "):
            sample.connected = max(sample.connected, int(float(line.split()[1])))


def run_size(args: argparse.Namespace, n: int, out: Path) -> dict[str, float | str]:
    """One run with n participants; the measured figures, or the reason it failed."""
    run = RunConfig(
        participants=n,
        fraction=args.fraction,
        rounds=args.rounds,
        epochs=1,
        valuation=args.valuation,
        validation_size=args.validation_size,
        seed=args.seed,
    )
    processes = math.ceil(n / args.ranks_per_process)
    launch = Launch(
        run,
        LaunchConfig(
            out=str(out),
            processes=processes,
            metrics_port=0,
            linger=2.0,
            round_timeout=args.max_seconds,
            timeout=args.max_seconds,
        ),
    )
    sample = Sample()
    started = time.time()
    try:
        _, metrics_port = launch.start()
        assert launch.coordinator is not None
        pid, seen, scraped = launch.coordinator.pid, 0, 0.0
        while launch.coordinator.poll() is None:
            read_proc(pid, sample)
            if time.time() - started > args.max_seconds:
                launch.stop()
                return {"failed": f"no end within {args.max_seconds:.0f} s ({seen} rounds done)"}
            if time.time() - scraped > 1.0:
                read_connected(metrics_port, sample)
                scraped = time.time()
            rounds = _rounds(out)
            for record in rounds[seen:]:
                sample.cpu_at_round[record.round] = sample.cpu_seconds
            seen = len(rounds)
            time.sleep(0.1)
        code = launch.follow(lambda line: None)
    finally:
        launch.stop()
    records = _rounds(out)
    if code != 0 or len(records) < run.rounds:
        return {"failed": f"coordinator exit {code}, {len(records)} rounds; see {out}/coordinator.log"}
    cpu = [sample.cpu_at_round[r] - sample.cpu_at_round.get(r - 1, 0.0) for r in range(2, run.rounds + 1)]
    timed = records[1:] or records
    return {
        "participants held": float(sample.connected),
        "processes": float(processes),
        "selected / round": float(run.selected_per_round),
        "all joined after (s)": records[0].started_at - started,
        "round latency (s)": statistics.median(r.round_seconds for r in timed),
        "  train wait (s)": statistics.median(r.train_wait_seconds for r in timed),
        "  valuation (s)": statistics.median(r.valuation_seconds for r in timed),
        "coordinator CPU / round (s)": statistics.median(cpu) if cpu else float("nan"),
        "coordinator peak RSS (MiB)": sample.peak_rss_mib,
        "coordinator threads (peak)": float(sample.threads),
        "MB up / round": statistics.median(r.bytes_up for r in records) / 1e6,
        "received / selected": sum(len(r.received) for r in records) / sum(len(r.selected) for r in records),
        "whole run (s)": time.time() - started,
    }


def _rounds(out: Path) -> list[RoundRecord]:
    path = out / "ledger.sqlite"
    if not path.exists():
        return []
    with Ledger(path, read_only=True) as ledger:
        return ledger.rounds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", default="100,200,400,800", help="sizes N, comma-separated")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks-per-process", type=int, default=100)
    parser.add_argument("--valuation", default="loo", help="loo keeps valuation light at m = 80")
    parser.add_argument("--validation-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="a run slower than this broke")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    sizes = [int(v) for v in args.participants.split(",")]
    print(f"command: {' '.join(sys.argv)}")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"open files limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
    )
    base = Path(args.out or tempfile.mkdtemp(prefix="fedsv-bench-load-"))
    results: dict[int, dict[str, float | str]] = {}
    for n in sizes:
        print(f"N = {n} ...", flush=True)
        results[n] = run_size(args, n, base / f"n{n}")
        if "failed" in results[n]:
            print(f"N = {n} broke: {results[n]['failed']}")
            break
    ok = [n for n in results if "failed" not in results[n]]
    if not ok:
        return 1
    print()
    print(f"{'per run (medians over rounds 2..T)':<34}" + "".join(f"{'N=' + str(n):>12}" for n in ok))
    for key in results[ok[0]]:
        cells = "".join(f"{float(results[n][key]):12.2f}" for n in ok)
        print(f"{key:<34}{cells}")
    broke = [n for n in results if "failed" in results[n]]
    print(f"\nbroke at N = {broke[0]}: {results[broke[0]]['failed']}" if broke else "\nnone broke")
    return 0


if __name__ == "__main__":
    sys.exit(main())
