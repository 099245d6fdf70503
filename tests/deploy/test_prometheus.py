"""deploy/prometheus and deploy/grafana: real Prometheus scrapes `fedsv launch` runs; every panel has data."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from fedsv.app.report import build_report
from fedsv.ledger import Ledger
from fedsv.pipeline.metrics import RunMetrics
from fedsv.security.tls import channel_credentials
from fedsv.wire.v1 import fedsv_pb2, fedsv_pb2_grpc
from tests.support.processes import DEPLOY, free_port, need_tool, wait_for

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "fedsv.json"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
PROMETHEUS_DIR = DEPLOY / "prometheus"
RUN: dict[str, int | float] = {
    "participants": 4,
    "fraction": 0.5,
    "rounds": 5,
    "epochs": 5,
    "validation-size": 200,
    "seed": 7,
    "processes": 1,
    # the final values are set as the backlog is valued, after the last round: served long enough for a
    # Prometheus starved of CPU on a loaded machine to scrape them (500 ms scrapes; 3 s by default)
    "linger": 15,
}
# What the issue asks the dashboard to show, as words that must appear in a panel's title.
REQUIRED_PANELS = [
    "round progress",
    "accuracy",
    "round duration",
    "phase durations",
    "connected / selected / received",
    "rejected updates",
    "with and without valuation",
    "utility evaluations",
    "top $k",
    "bottom $k",
    "valuation backlog",
    "valuation lag",
    "completed fedsv",
]

Target = dict[str, Any]
Panel = dict[str, Any]


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[Panel, Target]]:
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel, target


def _metric_names() -> set[str]:
    """Every sample name the coordinator exports (e.g. fedsv_rounds_completed_total, ..._bucket)."""
    metrics = RunMetrics()
    metrics.reject("probe")
    metrics.participant_fedsv.labels(participant="p000").set(0)
    metrics.participant_fedsv_normalized.labels(participant="p000").set(0)
    metrics.participant_fedsv_completed.labels(participant="p000").set(0)
    metrics.participant_quarantined.labels(participant="p000").set(0)
    metrics.participant_lookalike_rounds.labels(participant="p000").inc()
    metrics.round_bytes.labels(direction="up").set(0)
    metrics.phase_duration.labels(phase="valuation").observe(0)
    metrics.record_rpc("Join", "up", 1)
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def test_dashboard_is_well_formed_and_queries_only_exported_metrics() -> None:
    dashboard = _dashboard()
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    titles = " | ".join(p["title"].lower() for p in panels)
    for words in REQUIRED_PANELS:
        assert words in titles, f"no panel about {words!r}"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    exported = _metric_names()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    for panel, target in _targets(dashboard):
        assert target["datasource"]["uid"] == "${datasource}"
        expr = target["expr"]
        used = set(re.findall(r"\$(\w+)", expr)) - {"__range"}
        assert used <= set(variables), f"{panel['title']}: undefined variables {used - set(variables)}"
        names = set(re.findall(r"\bfedsv_\w+", expr))
        assert names and names <= exported, f"{panel['title']}: not exported: {names - exported}"


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard_folder() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "fedsv.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    docs = (DEPLOY.parent / "docs" / "deployment.md").read_text()
    assert provider["options"]["path"] in docs, (
        "docs/deployment.md must mount the dashboards where Grafana looks"
    )


def test_promtool_accepts_the_shipped_scrape_config() -> None:
    promtool = need_tool("promtool", "apt-get install prometheus")
    proc = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@dataclass
class Scraped:
    """Two `fedsv launch` runs (valuation exact and none, same seed) that a real Prometheus scraped."""

    api: str
    start: float
    end: float
    outs: dict[str, Path]

    def get(self, path: str, **params: object) -> Any:
        url = f"{self.api}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def instant(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr, time=self.end)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def range(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query_range", query=expr, start=self.start, end=self.end, step=1)
        result: list[dict[str, Any]] = data["result"]
        return result


def _bogus_join(grpc_port: int, tls_dir: Path) -> None:
    """A Join no coordinator may accept (rank out of range): the rejected-updates panel must show it.

    `fedsv launch` runs mutual TLS: the caller is participant p000 of the run (certificates in `tls_dir`).
    """
    credentials, _ = channel_credentials(tls_dir, 0)
    with grpc.secure_channel(f"127.0.0.1:{grpc_port}", credentials) as channel:
        stub = fedsv_pb2_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Join(fedsv_pb2.JoinRequest(rank=999, world_size=int(RUN["participants"])), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    prometheus = need_tool("prometheus", "apt-get install prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    # The shipped config and targets, with the scrape interval cut to 500 ms for runs of a few seconds.
    config_dir = tmp / "config"
    shutil.copytree(PROMETHEUS_DIR, config_dir)
    config = yaml.safe_load((config_dir / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="500ms", scrape_timeout="500ms", evaluation_interval="1s")
    (config_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    ports = {"exact": free_port(), "none": free_port()}
    test_targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"run": run}} for run, port in ports.items()]
    (config_dir / "targets" / "test-runs.yml").write_text(yaml.safe_dump(test_targets))

    web = free_port()
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=open(tmp / "prometheus.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )
    launches: dict[str, subprocess.Popen[str]] = {}
    try:
        api = f"http://127.0.0.1:{web}"

        def ready() -> bool:
            assert server.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{api}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_for(ready, 60, "Prometheus to be ready")
        start = time.time()
        outs = {run: tmp / f"run-{run}" for run in ports}
        for run, port in ports.items():
            flags = [part for k, v in RUN.items() for part in (f"--{k}", str(v))]
            extra = ["--metrics-port", str(port), "--out", str(outs[run])]
            launches[run] = subprocess.Popen(
                [sys.executable, "-m", "fedsv", "launch", *flags, "--valuation", run, *extra],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        for run in ports:
            port_file = outs[run] / "coordinator.port"
            wait_for(port_file.exists, 120, f"the {run} coordinator to serve")
            _bogus_join(int(port_file.read_text().split()[0]), outs[run] / "certs")
        for run, launch in launches.items():
            output, _ = launch.communicate(timeout=300)
            assert launch.returncode == 0, f"fedsv launch ({run}):\n{output[-3000:]}"
        yield Scraped(api=api, start=start, end=time.time(), outs=outs)
    finally:
        children: list[subprocess.Popen[Any]] = [*launches.values(), server]
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)


def _substitute(expr: str, dashboard: dict[str, Any], seconds: float) -> str:
    """Replace the dashboard's variables as Grafana does with their defaults (All = allValue)."""
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        value = variable["allValue"] if variable.get("includeAll") else variable["current"]["value"]
        expr = expr.replace(f"${variable['name']}", value)
    expr = expr.replace("$__range", f"{math.ceil(seconds)}s")
    assert "$" not in expr, expr
    return expr


def _finite(series: dict[str, Any]) -> list[float]:
    samples = series["values"] if "values" in series else [series["value"]]
    return [float(v) for _, v in samples if math.isfinite(float(v))]


@pytest.mark.slow
def test_every_dashboard_panel_returns_data_from_a_real_prometheus(scraped: Scraped) -> None:
    dashboard = _dashboard()
    seconds = scraped.end - scraped.start
    for panel, target in _targets(dashboard):
        expr = _substitute(target["expr"], dashboard, seconds)
        result = scraped.instant(expr) if target.get("instant") else scraped.range(expr)
        assert result, f"panel {panel['title']!r} query {target['refId']} returned nothing: {expr}"
        assert any(_finite(s) for s in result), f"panel {panel['title']!r} {target['refId']}: no finite value"
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "instance")
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
    assert match, variable["definition"]
    metric, label = match.groups()
    values = scraped.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
    assert len(values) == 2, f"the {label} variable should list both coordinators, got {values}"
    # The shipped targets file was read too (its coordinator is not running: it is only discovered).
    active = scraped.get("/api/v1/targets")["activeTargets"]
    assert {t["labels"].get("run") for t in active} >= {"valued", "exact", "none"}


def _panel(dashboard: dict[str, Any], title_part: str) -> Panel:
    """The panel titled `title_part` (any case), else the one panel whose title contains it."""
    panels = dashboard["panels"]
    exact = [p for p in panels if p["title"].lower() == title_part]
    (panel,) = exact or [p for p in panels if title_part in p["title"].lower()]
    return panel


def _by_run(result: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for series in result:
        out.setdefault(series["metric"].get("run", ""), []).append(series)
    return out


@pytest.mark.slow
def test_bytes_panel_shows_the_same_bytes_per_round_with_and_without_valuation(scraped: Scraped) -> None:
    dashboard = _dashboard()
    seconds = scraped.end - scraped.start
    (target,) = _panel(dashboard, "with and without valuation")["targets"]
    bytes_by_run = _by_run(scraped.range(_substitute(target["expr"], dashboard, seconds)))
    # The gauge holds the last completed round, which is what this (never restarted) process completed.
    rounds_by_run = _by_run(scraped.range("max by (run) (fedsv_rounds_completed_total)"))
    assert set(bytes_by_run) == {"exact", "none"}
    per_round: dict[str, dict[int, set[float]]] = {}
    for run in ("exact", "none"):
        (series,) = bytes_by_run[run]
        (rounds,) = rounds_by_run[run]
        round_at = {t: int(float(v)) for t, v in rounds["values"]}
        per_round[run] = {}
        for t, v in series["values"]:
            if round_at.get(t, 0) >= 1:
                per_round[run].setdefault(round_at[t], set()).add(float(v))
    common = set(per_round["exact"]) & set(per_round["none"])
    assert common, f"no round scraped in both runs: {per_round}"
    for number in common:
        assert per_round["exact"][number] == per_round["none"][number], f"round {number}: {per_round}"
    # ... and they are the bytes the ledgers recorded for those rounds.
    for run, out in scraped.outs.items():
        with Ledger(out / "ledger.sqlite", read_only=True) as ledger:
            recorded = {r.round: float(r.bytes_up + r.bytes_down) for r in ledger.rounds()}
        for number, values in per_round[run].items():
            assert recorded[number] in values, (run, number, values, recorded)


@pytest.mark.slow
def test_rejected_and_value_panels_show_what_the_coordinators_recorded(scraped: Scraped) -> None:
    dashboard = _dashboard()
    seconds = scraped.end - scraped.start
    rejected = _panel(dashboard, "rejected updates")["targets"][0]
    result = scraped.range(_substitute(rejected["expr"], dashboard, seconds))
    assert {(s["metric"].get("run"), s["metric"].get("reason")) for s in result} >= {
        ("exact", "bad_rank"),
        ("none", "bad_rank"),
    }

    def instant(title_part: str) -> list[dict[str, Any]]:
        (target,) = _panel(dashboard, title_part)["targets"]
        return scraped.instant(_substitute(target["expr"], dashboard, seconds))

    current = {s["metric"]["run"]: int(float(s["value"][1])) for s in instant("current round")}
    assert set(current) == {"exact", "none"} and min(current.values()) >= 1
    with Ledger(scraped.outs["exact"] / "ledger.sqlite", read_only=True) as ledger:
        records = {r.round: r for r in ledger.rounds()}
        values = ledger.values()
    last = current["exact"]
    # Gauges are set one after another; a scrape may fall between them: this round or the one before.
    candidates = [r for r in (last, last - 1) if r >= 1]
    accuracy = {s["metric"]["run"]: float(s["value"][1]) for s in instant("global test accuracy")}
    assert any(math.isclose(accuracy["exact"], records[r].test_accuracy) for r in candidates)

    k = int(next(v for v in dashboard["templating"]["list"] if v["name"] == "k")["current"]["value"])
    shown_top = instant("top $k participants by cumulative fedsv")
    shown_bottom = instant("bottom $k participants by cumulative fedsv")
    # a run that values nothing shows no value at all, never a certain 0
    assert {s["metric"]["run"] for s in [*shown_top, *shown_bottom]} == {"exact"}
    top = {s["metric"]["participant"]: float(s["value"][1]) for s in shown_top}
    bottom = {s["metric"]["participant"]: float(s["value"][1]) for s in shown_bottom}

    def same(shown: dict[str, float], want: dict[str, float]) -> bool:
        return shown.keys() == want.keys() and all(
            math.isclose(shown[p], want[p], abs_tol=1e-12) for p in want
        )

    matched = False
    for number in candidates:
        totals: dict[str, float] = {}
        for row in values:
            if row.round <= number:
                totals[row.participant] = totals.get(row.participant, 0.0) + row.fedsv
        ranked = sorted(totals.items(), key=lambda item: item[1])
        want_top, want_bottom = dict(ranked[-k:]), dict(ranked[:k])
        matched = matched or (same(top, want_top) and same(bottom, want_bottom))
    assert matched, f"top/bottom {k} {top} {bottom} match no ledger round in {candidates}"
    # The completed values (every member, selected or not), as the report completes them from the ledger.
    completed = build_report(scraped.outs["exact"])["totals"]["fedsv_completed"]
    shown = {s["metric"]["participant"]: float(s["value"][1]) for s in instant("by completed fedsv")}
    want = dict(sorted(completed.items(), key=lambda item: item[1])[-k:])
    assert shown.keys() == want.keys() and all(math.isclose(shown[p], want[p], abs_tol=1e-12) for p in want)


@pytest.mark.slow
def test_valuation_backlog_and_lag_panels_show_the_pipelined_valuation(scraped: Scraped) -> None:
    """`fedsv launch` values rounds in the background (pipelined, its default); --valuation none never."""
    dashboard = _dashboard()
    seconds = scraped.end - scraped.start

    def shown(title_part: str, ref: str) -> dict[str, list[float]]:
        (target,) = [t for t in _panel(dashboard, title_part)["targets"] if t["refId"] == ref]
        series_by_run = _by_run(scraped.range(_substitute(target["expr"], dashboard, seconds)))
        assert set(series_by_run) == {"exact", "none"}, f"{title_part} {ref}: {set(series_by_run)}"
        return {run: [v for s in series for v in _finite(s)] for run, series in series_by_run.items()}

    queued = shown("valuation backlog", "A")
    behind = shown("valuation backlog", "B")
    lag = shown("valuation lag (seconds)", "A")
    # Whole rounds wait or run behind (the backlog's bound is in bytes, far above these runs').
    for values in (*queued.values(), *behind.values()):
        assert values and all(v == int(v) and 0 <= v <= RUN["rounds"] for v in values), values
    # Without valuation there is no background valuation: nothing ever queued, behind or late.
    assert set(queued["none"]) == set(behind["none"]) == set(lag["none"]) == {0.0}
    # With it, the lag is 0 until round 1 has its values, then the lag the ledger recorded for a round.
    with Ledger(scraped.outs["exact"] / "ledger.sqlite", read_only=True) as ledger:
        records = ledger.rounds()
    assert records and not any(r.pending for r in records)
    recorded = [max(0.0, r.valuation_lag_seconds) for r in records]
    assert all(math.isfinite(v) for v in recorded), recorded
    for value in lag["exact"]:
        assert value == 0.0 or any(math.isclose(value, r, rel_tol=1e-9) for r in recorded), (value, recorded)
    assert any(any(math.isclose(v, r, rel_tol=1e-9) for r in recorded) for v in lag["exact"] if v > 0), (
        f"the lag panel never showed a round's lag: {sorted(set(lag['exact']))} vs {recorded}"
    )
