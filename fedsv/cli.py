"""The `fedsv` command line: subcommands over the runtime, the studies and the valuation demo."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from fedsv.config_args import add_dataclass_args, build_config, load_config_file
from fedsv.demo import DemoConfig, main_demo

logger = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsv", description="Federated learning with federated Shapley values."
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train FedAvg in this process on the embedded data and value every round's deltas"
    )
    demo.add_argument("--config", default=None, help="JSON file of settings (flags override it)")
    add_dataclass_args(demo, DemoConfig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "demo":
            file_values = load_config_file(args.config) if args.config else None
            return main_demo(build_config(DemoConfig, args, file_values))
    except (ValueError, FileNotFoundError) as exc:
        print(f"fedsv {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
