"""Load: one coordinator holding thousands of participants (thousands of ranks per process); where it breaks.

Usage: python benchmarks/bench_load.py [--participants 200,1000,3200,10000] [--selected 20] [--rounds 3]
                                       [--ranks-per-process 1000] [--valuation loo] [--max-seconds 600]

For each N, one real `fedsv launch` run (coordinator + ceil(N / ranks-per-process) participant
processes on loopback, mutual TLS, the paper's MLP, --selected participants a round (C = selected / N;
--fraction instead when --selected is 0), one local epoch) while this script samples the coordinator
and the participant processes from /proc every 0.1 s and scrapes the coordinator's metrics endpoint.
Prints one table, the sizes side by side: participants held (the coordinator's
`fedsv_participants_connected` peak), time until all had joined, median round latency and its parts,
coordinator CPU seconds per round, peak RSS (VmHWM), threads, and the RSS each held participant adds
beyond the base to the coordinator and to the participant processes (VmRSS at the first scrape with
some participants connected against the first with all, over the participants between: target at
most 100 KiB), and the participant processes' whole RSS over N (torch and the data included). N grows
until a run fails or passes --max-seconds: that is where it breaks, and the failed run still says how
far it got (participants connected over time, rounds done, the phase it stalled in).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import signal
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedsv.app.launch import Launch, LaunchConfig
from fedsv.data.embedded import load_embedded
from fedsv.ledger import Ledger, RoundRecord
from fedsv.settings.run import RunConfig

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """What /proc and the metrics endpoint said about the coordinator (running maxima, the RSS with none
    and with all participants connected) and about the participant processes."""

    peak_rss_mib: float = 0.0
    rss_mib: float = 0.0
    threads: int = 0
    connected: int = 0  # the peak
    now_connected: int = 0
    # (connected, coordinator VmRSS, participant processes' VmRSS summed) at the first scrape with some
    # but not all participants connected, and at the first with all: their slope is the memory one
    # held participant costs each side, beyond the base (the processes, torch, the data).
    partly: tuple[int, float, float] | None = None
    joined: tuple[int, float, float] | None = None
    participant_threads: int = 0  # the most threads one participant process had
    cpu_at_round: dict[int, float] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds, connected) per scrape


def _status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads of a process; {} once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


def read_proc(pid: int, sample: Sample) -> None:
    status = _status(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # the process has exited
        return
    sample.peak_rss_mib = max(sample.peak_rss_mib, status.get("VmHWM", 0) / 1024)
    sample.rss_mib = status.get("VmRSS", 0) / 1024
    sample.threads = max(sample.threads, status.get("Threads", 0))
    fields = stat.rsplit(")", 1)[1].split()
    sample.cpu_seconds = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def read_participants(pids: list[int], sample: Sample, n: int) -> None:
    """The participant processes' threads; their RSS and the coordinator's once all n are connected."""
    statuses = [_status(pid) for pid in pids]
    sample.participant_threads = max([sample.participant_threads, *(s.get("Threads", 0) for s in statuses)])
    now = (sample.now_connected, sample.rss_mib, sum(s.get("VmRSS", 0) for s in statuses) / 1024)
    if 0 < sample.now_connected < n and sample.partly is None:
        sample.partly = now
    if sample.now_connected >= n and sample.joined is None:
        sample.joined = now


def kib_per_participant(sample: Sample, side: int) -> float:
    """KiB each participant connected between the two scrapes added (side 1: coordinator, 2: participants)."""
    if sample.partly is None or sample.joined is None or sample.joined[0] <= sample.partly[0]:
        return float("nan")  # all joined between two scrapes
    return (sample.joined[side] - sample.partly[side]) * 1024 / (sample.joined[0] - sample.partly[0])


def read_connected(metrics_port: int, sample: Sample, elapsed: float) -> None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1) as reply:
            text = reply.read().decode()
    except OSError:
        return
    for line in text.splitlines():
        if line.startswith("fedsv_participants_connected "):
            sample.now_connected = int(float(line.split()[1]))
            sample.connected = max(sample.connected, sample.now_connected)
            sample.timeline.append((elapsed, sample.now_connected))


def stalled_report(sample: Sample, rounds_done: int, n: int, why: str) -> dict[str, float | str]:
    """How far a failed run got: the phase it stalled in, rounds done, participants connected over time."""
    phase = "joining" if rounds_done == 0 and sample.connected < n else f"round {rounds_done + 1}"
    step = max(1, len(sample.timeline) // 12)
    timeline = ", ".join(f"{t:.0f}s:{c}" for t, c in sample.timeline[::step])
    return {
        "failed": f"{why}; stalled in {phase} ({rounds_done} rounds done, {sample.connected}/{n} held at "
        f"most); connected over time: {timeline or 'never scraped'}",
    }


STOPPED_EXIT = 3
"""The coordinator's exit code for a run stopped before its last round (SIGTERM)."""

EMBEDDED_TRAIN = 4000
"""Embedded images left for training at the benchmark's validation sizes (a few per participant)."""


def grown_mnist(directory: Path, n: int) -> Path:
    """MNIST IDX files under `directory` with at least 2n training images: the embedded sample and
    copies shifted by one pixel (a load test needs enough samples per participant, not new digits)."""
    x, y = load_embedded().x, load_embedded().y
    images = (x[:, 0] * 255).round().astype(np.uint8)
    shifts = [(0, 0), (0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, -1), (1, -1), (-1, 1)]
    copies = min(len(shifts), math.ceil(2 * n / len(images)))
    train = np.concatenate([np.roll(images, s, axis=(1, 2)) for s in shifts[:copies]])
    labels = np.tile(y.astype(np.uint8), copies)
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, (imgs, labs) in {"train": (train, labels), "t10k": (images, y.astype(np.uint8))}.items():
        for kind, magic, array in (("images-idx3", 2051, imgs), ("labels-idx1", 2049, labs)):
            dims = struct.pack(f">{array.ndim}I", *array.shape)
            (directory / f"{prefix}-{kind}-ubyte").write_bytes(
                struct.pack(">I", magic) + dims + array.tobytes()
            )
    return directory


def run_size(args: argparse.Namespace, n: int, out: Path) -> dict[str, float | str]:
    """One run with n participants; the measured figures, or the reason it failed."""
    data = {"dataset": "mnist", "data_dir": args.data_dir} if args.data_dir else {}
    if not data and n > EMBEDDED_TRAIN:  # more participants than embedded images: shifted copies as IDX
        data = {"dataset": "mnist", "data_dir": str(grown_mnist(out.parent / "mnist-grown", n))}
    run = RunConfig(
        participants=n,
        fraction=args.selected / n if args.selected else args.fraction,
        **data,
        rounds=args.rounds + 1,  # the extra round is cut short by SIGTERM (how fast the coordinator stops)
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
            insecure=args.insecure,
        ),
    )
    sample = Sample()
    started = time.time()
    seen, code, signalled, stop_seconds = 0, -1, 0.0, float("nan")
    try:
        _, metrics_port = launch.start()
        assert launch.coordinator is not None
        pid, scraped = launch.coordinator.pid, 0.0
        pids = [p.pid for p in launch.participants]
        while launch.coordinator.poll() is None:
            read_proc(pid, sample)
            if time.time() - started > args.max_seconds:
                launch.stop()
                return stalled_report(sample, seen, n, f"no end within {args.max_seconds:.0f} s")
            if time.time() - scraped > 1.0:
                read_connected(metrics_port, sample, time.time() - started)
                read_participants(pids, sample, n)
                scraped = time.time()
            rounds = _rounds(out)
            for record in rounds[seen:]:
                sample.cpu_at_round[record.round] = sample.cpu_seconds
            seen = len(rounds)
            if seen >= args.rounds and not signalled:  # all rounds measured: stop it as an operator would
                os.kill(pid, signal.SIGTERM)
                signalled = time.time()
            time.sleep(0.05)
        if signalled:
            stop_seconds = time.time() - signalled
        code = launch.follow(lambda line: None)
    except Exception as exc:  # a launch that breaks still reports how far it got
        return stalled_report(sample, len(_rounds(out)), n, f"{type(exc).__name__}: {exc}")
    finally:
        launch.stop()
    records = _rounds(out)[: args.rounds]
    if code not in (0, STOPPED_EXIT) or len(records) < args.rounds:
        why = f"coordinator exit {code}, see {out}/coordinator.log"
        return stalled_report(sample, len(records), n, why)
    cpu = [sample.cpu_at_round[r] - sample.cpu_at_round.get(r - 1, 0.0) for r in range(2, args.rounds + 1)]
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
        "coord. KiB / held participant": kib_per_participant(sample, 1),
        "participant KiB / held rank": kib_per_participant(sample, 2),
        "participant procs RSS / rank (KiB)": (sample.joined[2] if sample.joined else 0.0) * 1024 / n,
        "participant threads (peak)": float(sample.participant_threads),
        "MB up / round": statistics.median(r.bytes_up for r in records) / 1e6,
        "received / selected": sum(len(r.received) for r in records) / sum(len(r.selected) for r in records),
        "SIGTERM to exit (s)": stop_seconds,
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
    parser.add_argument("--participants", default="200,1000,3200,10000", help="sizes N, comma-separated")
    parser.add_argument("--selected", type=int, default=20, help="selected a round (0: use --fraction)")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks-per-process", type=int, default=1000)
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC (default: mutual TLS)")
    parser.add_argument("--valuation", default="loo", help="loo keeps valuation light")
    parser.add_argument("--validation-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="a run slower than this broke")
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--data-dir", default="", help="MNIST IDX files to use (default: embedded; shifted copies past 4,000)"
    )
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
