"""`python -m coordinator`: run a coordinator for one run (resumes it from --state-dir)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from coordinator.config import RunConfig, ServerConfig
from coordinator.ledger import LedgerError
from coordinator.server import serve
from fedsv.config_args import add_dataclass_args, build_config, load_config_file

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coordinator", description="fedsv coordinator")
    parser.add_argument(
        "--config", default=None, help="JSON file of run and server settings (flags override)"
    )
    parser.add_argument("--log-level", default="WARNING")
    add_dataclass_args(parser, RunConfig)
    add_dataclass_args(parser, ServerConfig)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        values = load_config_file(args.config) if args.config else {}
        run_keys = set(RunConfig.__dataclass_fields__)
        server_keys = set(ServerConfig.__dataclass_fields__)
        unknown = sorted(set(values) - run_keys - server_keys)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}")
        run = build_config(RunConfig, args, {k: v for k, v in values.items() if k in run_keys})
        server = build_config(ServerConfig, args, {k: v for k, v in values.items() if k in server_keys})
        return serve(run, server)
    except (ValueError, LedgerError) as exc:
        print(f"coordinator: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
