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

from fedsv.config.logs import add_log_level, configure_logging
from fedsv.fl.ranks import participant_id
from fedsv.participant.config import ParticipantConfig
from fedsv.participant.host import RankHost
from fedsv.participant.local import preload
from fedsv.participant.ranks import resolve_ranks
from fedsv.participant.worker import RankWorker
from fedsv.security.certs import read_tokens
from fedsv.security.tls import channel_credentials, rank_token
from fedsv.settings.sources import ProcessSettings, add_settings, load_settings
from fedsv.task.interface import load_task

logger = logging.getLogger(__name__)


class ParticipantSettings(ProcessSettings, ParticipantConfig):
    """Every setting of a participant process."""


def _tokens(config: ParticipantConfig, ranks: Sequence[int]) -> dict[int, str]:
    """Check the TLS files of every rank; rank -> participant token."""
    if config.insecure:
        logger.warning("INSECURE: plaintext gRPC to %s (--insecure)", config.coordinator)
    for rank in ranks:
        if config.tls_dir:
            channel_credentials(config.tls_dir, rank)  # missing or half-present files: a clear error now
    if config.tokens_file:
        by_id = read_tokens(config.tokens_file)
        missing = [r for r in ranks if participant_id(r) not in by_id]
        if missing:
            raise ValueError(f"{config.tokens_file} has no token for ranks {missing}")
        return {r: by_id[participant_id(r)] for r in ranks}
    return {r: rank_token(config.tls_dir, r) for r in ranks} if config.tls_dir else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedsv.participant", description="fedsv participant ranks"
    )
    add_log_level(parser)
    source = add_settings(parser, ParticipantSettings)
    try:
        args = parser.parse_args(argv)
        configure_logging(args.log_level)
        config = load_settings(ParticipantSettings, source, args).part(ParticipantConfig)
        assignment = resolve_ranks(
            config.rank, config.world_size, config.ranks, ranks_per_process=config.ranks_per_process
        )
        tokens = _tokens(config, assignment.ranks)
        local = config.local
        task = load_task(config.task) if config.task.strip() else None
        samples = {rank: preload(local, task, rank) for rank in assignment.ranks}  # bad files: fail now
    except (ValueError, OSError) as exc:  # TaskError and DataError too; OSError: a path it names
        print(f"participant: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, config.threads))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = [
        RankWorker(
            config.coordinator,
            rank,
            assignment.world_size,
            credential=config.credential,
            local=local,
            task=task,
            samples=samples[rank],
            give_up_after=config.give_up_after,
            stop=stop,
            tls_dir=config.tls_dir,
            token=tokens.get(rank, ""),
            server_name=config.tls_server_name,
        )
        for rank in assignment.ranks
    ]
    results = RankHost(workers, stop, training_threads=config.training_threads).run()
    ended = {rank: str(result) for rank, result in results.items()}
    logger.info("ranks %s (%s) ended: %s", assignment.ranks, assignment.source, ended)
    return 0 if all(result.ok for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
