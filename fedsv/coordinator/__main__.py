"""`python -m fedsv.coordinator`: run a coordinator for one run (resumes it from --state-dir)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fedsv.config.logs import add_log_level, configure_logging
from fedsv.coordinator.server import serve
from fedsv.coordinator.server_config import ServerConfig
from fedsv.ledger import LedgerError
from fedsv.settings.run import RunConfig
from fedsv.settings.sources import ProcessSettings, add_settings, load_settings


class CoordinatorSettings(ProcessSettings, ServerConfig, RunConfig):
    """Every setting of the coordinator process: the run's and the server's."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsv.coordinator", description="fedsv coordinator")
    add_log_level(parser)
    source = add_settings(parser, CoordinatorSettings)
    try:
        args = parser.parse_args(argv)
        configure_logging(args.log_level)
        settings = load_settings(CoordinatorSettings, source, args)
        return serve(settings.part(RunConfig), settings.part(ServerConfig))
    except (ValueError, LedgerError, OSError) as exc:  # OSError: a path or port the settings name
        print(f"coordinator: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
