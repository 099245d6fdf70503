"""The --log-level flag every fedsv command shares, and logging set up from it (gRPC core's own at ERROR)."""

from __future__ import annotations

import argparse
import logging
import os

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_log_level(parser: argparse.ArgumentParser, default: str = "WARNING") -> None:
    """--log-level LEVEL, one of LOG_LEVELS in any case; anything else is argparse's one-line usage error."""
    parser.add_argument(
        "--log-level",
        default=default,
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help=f"logging level: {', '.join(LOG_LEVELS)} (default: {default})",
    )


def quiet_grpc_core() -> None:
    """gRPC core's own log lines (one per failed TLS handshake, unthrottled) at ERROR unless the
    environment asks otherwise. gRPC reads GRPC_VERBOSITY when it is imported, so the packages with
    an entry point (coordinator, participant, app) call this as they are imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def configure_logging(level: str) -> None:
    """The process's logging at `level` (checked by add_log_level), in fedsv's line format."""
    quiet_grpc_core()
    logging.basicConfig(level=level, format=LOG_FORMAT)
