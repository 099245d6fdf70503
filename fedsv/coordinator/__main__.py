"""`python -m fedsv.coordinator`: run a coordinator for one run (resumes it from --state-dir)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fedsv.config.flags import add_dataclass_args, build_configs, load_config_file
from fedsv.config.logs import add_log_level, configure_logging
from fedsv.coordinator.server import serve
from fedsv.coordinator.server_config import ServerConfig
from fedsv.ledger import LedgerError
from fedsv.settings.run import RunConfig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsv.coordinator", description="fedsv coordinator")
    parser.add_argument(
        "--config", default=None, help="JSON file of run and server settings (flags override)"
    )
    add_log_level(parser)
    add_dataclass_args(parser, RunConfig)
    add_dataclass_args(parser, ServerConfig)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        values = load_config_file(args.config) if args.config else {}
        run, server = build_configs(args, values, RunConfig, ServerConfig)
        return serve(run, server)
    except (ValueError, LedgerError, OSError) as exc:  # OSError: a path or port the settings name
        print(f"coordinator: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
