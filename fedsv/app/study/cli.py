"""`fedsv study noisy|backdoor|summarize`: the subcommand's flags and its entry point."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic_settings import CliSettingsSource

from fedsv.app.study.config import STUDIES, StudyConfig
from fedsv.settings.sources import ProcessSettings, add_settings, load_settings


class StudySettings(ProcessSettings, StudyConfig):
    """Every setting of `fedsv study`."""


def add_study_parser(sub: argparse._SubParsersAction) -> CliSettingsSource[Any]:
    """Register `fedsv study` on the `fedsv` command's subparsers."""
    study = sub.add_parser(
        "study",
        help="the paper's experiments through the runtime: noisy labels, backdoors, data summarization",
        description="Runs the paper's empirical study through `fedsv launch` and writes points.csv, "
        "summary.json, summary.md and PNG figures under --out.",
    )
    study.add_argument("study", choices=STUDIES, help="which study")
    return add_settings(study, StudySettings)


def main_study(args: argparse.Namespace, source: CliSettingsSource[Any]) -> int:
    from fedsv.app.study.study import run_study  # matplotlib and the study modules load only when used

    config = load_settings(StudySettings, source, args).part(StudyConfig)
    summary = run_study(args.study, config, report=lambda line: print(line, flush=True))
    print((Path(summary["config"]["out"]) / "summary.md").read_text(), end="")
    return 0
