"""The `fedsv` command line: launch a run, report on it, or run the in-process valuation demo."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic_settings import CliSettingsSource

from fedsv.app.demo import DemoConfig, main_demo
from fedsv.app.launch import Launch, LaunchConfig, LaunchError
from fedsv.app.study.cli import add_study_parser, main_study
from fedsv.app.study.runner import StudyError
from fedsv.config.logs import add_log_level, configure_logging
from fedsv.ledger import LedgerError
from fedsv.settings.run import RunConfig
from fedsv.settings.schema import SCHEMA, checked_setting
from fedsv.settings.sources import ProcessSettings, add_settings, load_settings


class LaunchSettings(ProcessSettings, LaunchConfig, RunConfig):
    """Every setting of `fedsv launch`: the run's and where it runs on this machine."""


class DemoSettings(ProcessSettings, DemoConfig):
    """Every setting of `fedsv demo`."""


def _parser() -> tuple[argparse.ArgumentParser, dict[str, CliSettingsSource[Any]]]:
    parser = argparse.ArgumentParser(
        prog="fedsv", description="Federated learning with federated Shapley values."
    )
    add_log_level(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    launch = sub.add_parser("launch", help="run a coordinator and participant processes on this machine")
    sources = {"launch": add_settings(launch, LaunchSettings)}

    report = sub.add_parser("report", help="print the values and traffic of a finished run")
    report.add_argument(
        "run_dir",
        help="run directory written by `fedsv launch`, or a folder of runs (a Flower ledger folder): its "
        "latest run, the others listed",
    )
    report.add_argument("--json", action="store_true", help="print report.json instead of the table")
    report.add_argument(
        "--html",
        action="store_true",
        help="write the run's report.html (a self-contained page) and say where",
    )
    report.add_argument(
        "--by-class", action="store_true", help="print each participant's FedSV per validation label"
    )

    certs = sub.add_parser("certs", help="create a run's CA, coordinator and per-participant certificates")
    certs.add_argument("--out", required=True, help="directory to write them into (keys 0600)")
    certs.add_argument("--participants", type=int, required=True, help=SCHEMA["participants"].description)
    certs.add_argument(
        "--hosts", default="", help="extra names/IPs of the coordinator, comma-separated (e.g. its DNS name)"
    )
    certs.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")

    payout = sub.add_parser("payout", help="split a budget among a run's participants by their values")
    payout.add_argument("run_dir", help="run directory written by `fedsv launch`")
    payout.add_argument("--amount", type=float, required=True, help="the budget to split")
    payout.add_argument(
        "--value",
        default="fedsv_shrunk",
        help="fedsv_shrunk (the recommended value, docs/valuation.md) | fedsv_completed | fedsv | "
        "fedsv_normalized | loo",
    )
    payout.add_argument(
        "--negative", default="zero", help="zero: negative values get nothing | shift: pay value - the lowest"
    )
    payout.add_argument(
        "--rule",
        default="value",
        help="value: each by its own value | groups: members the values cannot tell apart are paid alike",
    )
    payout.add_argument("--out", default="", help="CSV to write (default RUN_DIR/payout.csv)")

    demo = sub.add_parser("demo", help="train FedAvg in this process and value every round's deltas")
    sources["demo"] = add_settings(demo, DemoSettings)
    sources["study"] = add_study_parser(sub)
    return parser, sources


def main_launch(args: argparse.Namespace, source: CliSettingsSource[Any]) -> int:
    from fedsv.app.live_page import LivePage
    from fedsv.app.report_files import write_outputs
    from fedsv.app.report_text import format_table

    settings = load_settings(LaunchSettings, source, args)
    run, launch_config = settings.part(RunConfig), settings.part(LaunchConfig)
    launch = Launch(run, launch_config, log_level=args.log_level)
    print(
        f"fedsv launch: {run.participants} participants ({run.selected_per_round} per round), "
        f"{run.rounds} rounds, "
        f"{run.model} on {run.dataset} ({run.partition}), valuation={run.valuation}, out={launch_config.out}",
        flush=True,
    )
    warning = run.selection_warning()
    if warning is not None:
        print(f"fedsv launch: warning: {warning}", file=sys.stderr, flush=True)
    live = LivePage(launch_config.out)  # report.html, rewritten as rounds get their values
    try:
        grpc_port, metrics_port = launch.start()
        print(f"coordinator on 127.0.0.1:{grpc_port}, metrics on :{metrics_port}", flush=True)
        code = launch.follow(lambda line: print(line, flush=True), on_valued=live.refresh)
    finally:
        live.close()
        launch.stop()
    if code != 0:
        print(
            f"fedsv launch: coordinator exited with {code}; see {launch_config.out}/coordinator.log",
            file=sys.stderr,
        )
        return code
    outputs = write_outputs(launch_config.out)
    print()
    print(format_table(json.loads(outputs["report.json"].read_text())))
    print("\nwrote " + ", ".join(str(p) for p in outputs.values()))
    return 0


def main_certs(args: argparse.Namespace) -> int:
    from fedsv.security.certs import generate

    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    participants = checked_setting("participants", args.participants)
    made = generate(args.out, participants, hosts, args.days)
    names = ", ".join(["localhost", "127.0.0.1", "::1", *hosts])
    print(
        f"wrote ca.pem/.key, coordinator.pem/.key (for {names}), "
        f"p000..p{args.participants - 1:03d}.pem/.key/.token and tokens.txt into {made.out}"
    )
    return 0


def main_payout(args: argparse.Namespace) -> int:
    from fedsv.app.payout import format_payout, payout, write_csv

    rows = payout(args.run_dir, args.amount, args.value, args.negative, args.rule)
    out = Path(args.out) if args.out else Path(args.run_dir) / "payout.csv"
    write_csv(out, rows)
    print(format_payout(rows, args.amount, args.value, args.negative, args.rule))
    print(f"\nwrote {out}")
    return 0


def main_report(args: argparse.Namespace) -> int:
    from fedsv.app.report import build_report
    from fedsv.app.report_text import format_classes, format_runs, format_table
    from fedsv.app.run_dirs import resolve_run

    ledger, runs = resolve_run(args.run_dir)
    if runs:  # a folder of runs: which one this is, and the others (stderr: --json stays JSON)
        print(format_runs(runs, ledger.parent), file=sys.stderr)
    report = build_report(ledger.parent)
    if args.html:
        from fedsv.app.live_page import write_page

        print(f"wrote {write_page(ledger.parent, report)}")
        return 0
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_classes(report) if args.by_class else format_table(report))
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser, sources = _parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (kill, a scheduler ending the job) unwinds like Ctrl-C: a launch or a study stops the
        # coordinator and participant processes it started instead of leaving them running
        signal.signal(signal.SIGTERM, _interrupt)
    configure_logging(args.log_level)
    try:
        if args.command == "launch":
            return main_launch(args, sources["launch"])
        if args.command == "certs":
            return main_certs(args)
        if args.command == "report":
            return main_report(args)
        if args.command == "payout":
            return main_payout(args)
        if args.command == "study":
            return main_study(args, sources["study"])
        return main_demo(load_settings(DemoSettings, sources["demo"], args).part(DemoConfig))
    except BrokenPipeError:
        # The reader went away (`fedsv report RUN | head`): stop quietly, as other Unix tools do, and
        # point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    # One-line messages for what the user can fix (settings, files, a run that could not start); any
    # other exception is a bug and keeps its traceback.
    except (ValueError, OSError, LedgerError, LaunchError, StudyError) as exc:
        print(f"fedsv {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fedsv {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
