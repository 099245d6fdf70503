"""`python -m fedsv.participant`: play one or many ranks of a run (flags, mpirun, Kubernetes, torchrun)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import torch

from fedsv.config.checks import check_address, check_count, check_seconds
from fedsv.config.logs import add_log_level, configure_logging
from fedsv.fl.device import resolve_device
from fedsv.fl.ranks import participant_id
from fedsv.participant.host import RankHost
from fedsv.participant.local import LocalSettings, preload
from fedsv.participant.ranks import resolve_ranks
from fedsv.participant.worker import RankWorker
from fedsv.security.certs import read_tokens
from fedsv.security.tls import channel_credentials, rank_token
from fedsv.task.interface import load_task

logger = logging.getLogger(__name__)


def _tokens(args: argparse.Namespace, ranks: Sequence[int]) -> dict[int, str]:
    """Check the transport flags and the TLS files of every rank; rank -> participant token."""
    if bool(args.tls_dir) == bool(args.insecure):
        raise ValueError(
            "choose --tls-dir DIR (TLS; the directory `fedsv certs` made) or --insecure (plaintext)"
            if not args.insecure
            else "choose one of --tls-dir and --insecure, not both"
        )
    if args.insecure:
        logger.warning("INSECURE: plaintext gRPC to %s (--insecure)", args.coordinator)
    for rank in ranks:
        if args.tls_dir:
            channel_credentials(args.tls_dir, rank)  # missing or half-present files: a clear error now
    if args.tokens_file:
        by_id = read_tokens(args.tokens_file)
        missing = [r for r in ranks if participant_id(r) not in by_id]
        if missing:
            raise ValueError(f"{args.tokens_file} has no token for ranks {missing}")
        return {r: by_id[participant_id(r)] for r in ranks}
    return {r: rank_token(args.tls_dir, r) for r in ranks} if args.tls_dir else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedsv.participant", description="fedsv participant ranks"
    )
    parser.add_argument("--coordinator", required=True, help="coordinator address HOST:PORT")
    parser.add_argument("--rank", type=int, default=None, help="this process's single rank")
    parser.add_argument("--world-size", type=int, default=None, help="number of participants N")
    parser.add_argument("--ranks", default=None, help="ranks this process plays, e.g. 0-24 or 0-4,9")
    parser.add_argument("--ranks-per-process", type=int, default=None, help="under mpirun: ranks per process")
    parser.add_argument("--credential", default="", help="the run's join credential")
    parser.add_argument(
        "--tls-dir",
        default="",
        help="TLS: directory with the run's ca.pem and, for mutual TLS, its ranks' pNNN.pem/.key",
    )
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC (no TLS); logs a warning")
    parser.add_argument(
        "--tokens-file",
        default="",
        help="per-participant tokens, lines 'pNNN TOKEN' (default: pNNN.token in --tls-dir)",
    )
    parser.add_argument(
        "--tls-server-name", default="", help="expect this name in the coordinator's certificate"
    )
    parser.add_argument(
        "--task", default="", help="the run's task, MODULE:ATTR or FILE.py:ATTR (default: the built-in one)"
    )
    parser.add_argument(
        "--data",
        default="",
        help="this rank's own data: a file or folder, '{rank}' filled in per rank "
        "(e.g. data/part{rank}.npz); default: the run's simulated shard (simulated:DATASET)",
    )
    parser.add_argument("--data-dir", default="", help="directory of the simulated data set's files")
    parser.add_argument(
        "--device", default="cpu", help="where this process's ranks train: cpu (default) | auto | cuda[:N]"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (1 = deterministic)"
    )
    parser.add_argument(
        "--training-threads",
        type=int,
        default=0,
        help="threads that train this process's selected ranks (0 = about the cores); the ranks "
        "themselves are coroutines on one event loop",
    )
    parser.add_argument("--give-up-after", type=float, default=600.0, help="seconds without a coordinator")
    add_log_level(parser)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        check_address("coordinator", args.coordinator)
        check_count("threads", args.threads, high=4096)
        check_count("training_threads", args.training_threads, low=0, high=4096)
        check_seconds("give_up_after", args.give_up_after)
        assignment = resolve_ranks(
            args.rank, args.world_size, args.ranks, ranks_per_process=args.ranks_per_process
        )
        tokens = _tokens(args, assignment.ranks)
        local = LocalSettings(task=args.task, data=args.data, data_dir=args.data_dir, device=args.device)
        resolve_device(args.device)  # an unknown or absent device: a one-line error now
        task = load_task(args.task) if args.task.strip() else None
        samples = {rank: preload(local, task, rank) for rank in assignment.ranks}  # bad files: fail now
    except (ValueError, OSError) as exc:  # TaskError and DataError too; OSError: a path it names
        print(f"participant: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, args.threads))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = [
        RankWorker(
            args.coordinator,
            rank,
            assignment.world_size,
            credential=args.credential,
            local=local,
            task=task,
            samples=samples[rank],
            give_up_after=args.give_up_after,
            stop=stop,
            tls_dir=args.tls_dir,
            token=tokens.get(rank, ""),
            server_name=args.tls_server_name,
        )
        for rank in assignment.ranks
    ]
    results = RankHost(workers, stop, training_threads=args.training_threads).run()
    ended = {rank: str(result) for rank, result in results.items()}
    logger.info("ranks %s (%s) ended: %s", assignment.ranks, assignment.source, ended)
    return 0 if all(result.ok for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
