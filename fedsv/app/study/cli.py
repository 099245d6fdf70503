"""`fedsv study noisy|backdoor|summarize`: the subcommand's flags and its entry point."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedsv.app.study.config import STUDIES, StudyConfig
from fedsv.config.flags import add_dataclass_args, build_config, load_config_file


def add_study_parser(sub: argparse._SubParsersAction) -> None:
    """Register `fedsv study` on the `fedsv` command's subparsers."""
    study = sub.add_parser(
        "study",
        help="the paper's experiments through the runtime: noisy labels, backdoors, data summarization",
        description="Runs the paper's empirical study through `fedsv launch` and writes points.csv, "
        "summary.json, summary.md and PNG figures under --out.",
    )
    study.add_argument("study", choices=STUDIES, help="which study")
    study.add_argument("--config", default=None, help="JSON file of study settings (flags override it)")
    add_dataclass_args(study, StudyConfig)


def main_study(args: argparse.Namespace) -> int:
    from fedsv.app.study.study import run_study  # matplotlib and the study modules load only when used

    file_values = load_config_file(args.config) if args.config else None
    config = build_config(StudyConfig, args, file_values)
    summary = run_study(args.study, config, report=lambda line: print(line, flush=True))
    print((Path(summary["config"]["out"]) / "summary.md").read_text(), end="")
    return 0
