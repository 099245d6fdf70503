"""Every setting is declared once (fedsv.settings) and round-trips through flags, files, FEDSV_*, the wire."""

from __future__ import annotations

import argparse
import ast
import json
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

import fedsv
from fedsv.app.cli import DemoSettings, LaunchSettings
from fedsv.app.demo import DemoConfig
from fedsv.app.launch import LaunchConfig
from fedsv.app.study.cli import StudySettings
from fedsv.app.study.config import StudyConfig
from fedsv.coordinator.__main__ import CoordinatorSettings
from fedsv.coordinator.server_config import ServerConfig
from fedsv.ledger import Ledger, LedgerError
from fedsv.participant.__main__ import ParticipantSettings
from fedsv.participant.config import ParticipantConfig
from fedsv.settings.run import RunConfig
from fedsv.settings.run_spec import CARRIED, from_run_spec, to_run_spec
from fedsv.settings.schema import SCHEMA, added_later, declared_default, setting
from fedsv.settings.sources import ENV_PREFIX, ProcessSettings, add_settings, load_settings

PACKAGE = Path(fedsv.__file__).parent
CONFIGS: list[type[Any]] = [RunConfig, ServerConfig, LaunchConfig, ParticipantConfig, StudyConfig, DemoConfig]
PROCESSES: list[type[ProcessSettings]] = [
    CoordinatorSettings, ParticipantSettings, LaunchSettings, DemoSettings, StudySettings
]  # fmt: skip
"""The one settings model of each process: `python -m fedsv.coordinator`, `python -m fedsv.participant`,
`fedsv launch`, `fedsv demo`, `fedsv study`."""

LIBRARY_API = {
    ("ValuationSpec", "eps"): "fedsv.valuation's own API, used without a run",
    ("ValuationSpec", "delta"): "fedsv.valuation's own API, used without a run",
    ("ValuationSpec", "seed"): "fedsv.valuation's own API, used without a run",
    ("Settings", "eps"): "an estimator's own settings (fedsv.valuation.estimators.estimator)",
    ("Settings", "delta"): "an estimator's own settings (fedsv.valuation.estimators.estimator)",
    ("Settings", "seed"): "an estimator's own settings (fedsv.valuation.estimators.estimator)",
    ("GameSettings", "metric"): "fedsv.valuation's round game, used without a run",
    ("TrainConfig", "lr"): "the task layer's local training, used by tasks without a run",
    ("PaperTask", "model"): "the built-in task's own constructor",
    ("PaperTask", "metric"): "the built-in task's own constructor",
}
"""Dataclasses below the settings that keep a default equal to a setting's: the libraries' own Python API.
A run always passes the setting's value to them."""


def _is_config_class(node: ast.ClassDef) -> bool:
    """A dataclass or a pydantic model: a class whose fields may declare a setting."""
    decorated = any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)
    return decorated or any(
        ast.unparse(base).endswith(("Model", "Config", "Settings")) for base in node.bases
    )


def _uses(value: ast.expr, *names: str) -> bool:
    return isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in names


def second_declarations(sources: dict[str, str]) -> list[str]:
    """Where a setting's default or flag is declared outside the schema, in the given module sources."""
    found: list[str] = []
    plain_fields: dict[str, list[str]] = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    name = first.value.lstrip("-").replace("-", "_")
                    given = {k.arg: k.value for k in node.keywords}
                    default = given.get("default")
                    literal = ast.literal_eval(default) if isinstance(default, ast.Constant) else None
                    if name in SCHEMA and literal == declared_default(name):
                        found.append(
                            f"{path}: flag --{first.value.lstrip('-')} repeats the setting's default"
                        )
            if not (isinstance(node, ast.ClassDef) and _is_config_class(node)):
                continue
            items = [i for i in node.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)]
            settings_class = any(
                i.value is not None and _uses(i.value, "setting", "setting_list") for i in items
            )
            for item in items:
                assert isinstance(item.target, ast.Name)
                name, value = item.target.id, item.value
                if value is None or _uses(value, "setting", "setting_list"):
                    continue
                where = f"{path}: {node.name}.{name}"
                if name in SCHEMA and settings_class:
                    found.append(f"{where} declares a setting again (use setting({name!r}))")
                    continue
                if settings_class and _uses(value, "field", "Field"):
                    plain_fields.setdefault(name, []).append(where)
                default_node: ast.expr = value
                if isinstance(value, ast.Call) and _uses(value, "Field"):
                    keywords = {k.arg: k.value for k in value.keywords}
                    default_node = value.args[0] if value.args else keywords.get("default", value)
                try:
                    literal = ast.literal_eval(default_node)
                except ValueError:
                    continue
                declared = declared_default(name) if name in SCHEMA else None
                if name in SCHEMA and literal == declared and (node.name, name) not in LIBRARY_API:
                    found.append(f"{where} = {literal!r} repeats the setting's default")
    found += [f"{name} declared in {places}" for name, places in plain_fields.items() if len(places) > 1]
    return found


def test_no_setting_is_declared_twice() -> None:
    sources = {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    assert second_declarations(sources) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "@dataclass\nclass X:\n    a: int = setting('rounds')\n    lr: float = field(default=0.1)\n",
        "class X(ConfigModel):\n    a: int = setting('rounds')\n    lr: float = Field(0.1, gt=0)\n",
        "class Holder(BaseModel):\n    validation_size: int = Field(1000, ge=1)\n",
        "@dataclass\nclass Holder:\n    validation_size: int = 1000\n",
        "parser.add_argument('--give-up-after', type=float, default=600.0)\n",
        "parser.add_argument('--data-dir', default='')\n",
        "@dataclass\nclass A:\n    a: int = setting('rounds')\n    knob: int = field(default=1)\n"
        "@dataclass\nclass B:\n    b: int = setting('rounds')\n    knob: int = field(default=2)\n",
        "class A(ConfigModel):\n    a: int = setting('rounds')\n    knob: int = Field(1)\n"
        "class B(ConfigModel):\n    b: int = setting('rounds')\n    knob: int = Field(2)\n",
    ],
)
def test_the_scan_finds_a_second_declaration(snippet: str) -> None:
    assert second_declarations({"x.py": snippet}), snippet


def test_a_changed_default_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        setting("rounds", default=7)
    field = setting("rounds", default=7, why="a study")
    assert field.default == 7 and "7 here: a study" in field.description
    assert SCHEMA["rounds"].default == 5  # the declaration itself is untouched


def test_every_declared_setting_is_used_and_every_config_field_is_one() -> None:
    used = {name for cls in CONFIGS for name in cls.model_fields if name in SCHEMA}
    assert used == set(SCHEMA)
    for cls in (RunConfig, ServerConfig, ParticipantConfig):
        assert set(cls.model_fields) <= set(SCHEMA), cls
    for cls in CONFIGS:  # a field named as a setting is the setting: its range and help, not a copy's
        for name, field in cls.model_fields.items():
            if name in SCHEMA and not field.description.startswith("a comma list of"):  # a study's sweep
                assert field.metadata == SCHEMA[name].metadata, (cls, name)
                assert field.description.startswith(SCHEMA[name].description), (cls, name)
    for process in PROCESSES:  # each process's one model holds every field of its configs
        bases = [base for base in process.__mro__ if base in CONFIGS]
        assert bases and set(process.model_fields) == set().union(*(b.model_fields for b in bases)), process


# A valid value other than the default for every setting, and what else a class needs for it to be valid.
SAMPLES: dict[str, Any] = {
    "task": "fedsv.tasks:mnist_mlp",
    "validation_data": "val.npz",
    "test_data": "test.npz",
    "data_dir": "files",
    "corrupt": "0=flip:0.1",
    "selection": "1=0;2=1;3=2;4=3;5=4",
    "valuation_budget": 50,
    "aggregation_byzantine": 2,
    "valuation_device": "cpu",
    "device": "auto",
    "model": "cnn",
    "coordinator": "host:2",
    "ranks": "0-1",
    "data": "d/{rank}.npz",
    "out": "o",
    "validation_from": "test",
    "partition": "noniid",
    "flip_to": "own",
    "corruption": "flip:0.2",
    "backdoor": "backdoor:target=1",
}
BASES: dict[type[Any], dict[str, Any]] = {
    CoordinatorSettings: {"dataset": "mnist", "insecure": True},
    DemoSettings: {"dataset": "mnist"},
    StudySettings: {"dataset": "mnist"},
    LaunchSettings: {"dataset": "mnist"},
    ParticipantSettings: {"coordinator": "host:1", "insecure": True},
}
NEEDS: dict[str, dict[str, Any]] = {
    "task": {"validation_data": "val.npz"},
    "tls_dir": {"insecure": False},
    "dataset": {"validation_from": "train"},
}


def _sample(name: str, default: Any) -> Any:
    if name in SAMPLES and SAMPLES[name] != default:
        return SAMPLES[name]
    if isinstance(default, Enum):
        return next(m.value for m in type(default) if m != default and m.value != "none")
    if isinstance(default, bool):
        return not default
    if default is None:
        return 3
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 2 if default else 0.5
    return "x"


def _cases() -> list[tuple[type[Any], str]]:
    return [(process, name) for process in PROCESSES for name in process.model_fields]


def _flags(values: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        option = "--" + key.replace("_", "-")
        out += (
            [option if value else "--no-" + option[2:]] if isinstance(value, bool) else [option, str(value)]
        )
    return out


def _env_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _toml(values: dict[str, Any]) -> str:
    return "".join(
        f"{key} = {str(v).lower() if isinstance(v, bool) else json.dumps(v)}\n" for key, v in values.items()
    )


def _load(process: type[ProcessSettings], argv: list[str]) -> Any:
    parser = argparse.ArgumentParser()
    source = add_settings(parser, process)
    return load_settings(process, source, parser.parse_args(argv))


@pytest.mark.parametrize(("process", "name"), _cases(), ids=lambda v: getattr(v, "__name__", v))
def test_every_setting_round_trips_through_flags_files_the_environment_and_the_wire(
    process: type[ProcessSettings], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(__import__("os").environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    value = _sample(name, process.model_fields[name].default)
    others = {**BASES[process], **{k: v for k, v in NEEDS.get(name, {}).items() if k != name}}
    others = {k: v for k, v in others.items() if k != name and k in process.model_fields}
    values = {**others, name: value}

    from_flags = _load(process, _flags(values))
    assert getattr(from_flags, name) == value, "--" + name.replace("_", "-")
    assert getattr(from_flags, name) != process.model_fields[name].default
    json_file = tmp_path / "settings.json"
    json_file.write_text(json.dumps(values))
    toml_file = tmp_path / "settings.toml"
    toml_file.write_text(_toml(values))
    for config in (json_file, toml_file):
        assert _load(process, ["--config", str(config)]) == from_flags, config.name
    with monkeypatch.context() as env:
        for key, v in values.items():
            env.setenv(ENV_PREFIX + key.upper(), _env_text(v))
        assert _load(process, []) == from_flags, ENV_PREFIX + name.upper()
    if process is CoordinatorSettings and name in CARRIED:
        run = from_flags.part(RunConfig)
        wire = from_run_spec(to_run_spec(run, "run-x", "none", 1 << 20))
        assert getattr(wire, name) == value
        assert {n: getattr(wire, n) for n in CARRIED} == {n: getattr(run, n) for n in CARRIED}


def test_flags_override_the_file_which_overrides_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "run.toml"
    config.write_text("rounds = 7\nseed = 3\n")
    monkeypatch.setenv("FEDSV_ROUNDS", "8")
    monkeypatch.setenv("FEDSV_SEED", "4")
    monkeypatch.setenv("FEDSV_EPOCHS", "2")
    settings = _load(CoordinatorSettings, ["--insecure", "--config", str(config), "--rounds", "9"])
    assert (settings.rounds, settings.seed, settings.epochs, settings.batch_size) == (9, 3, 2, 10)
    assert _load(CoordinatorSettings, ["--insecure"]).rounds == 8


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("flag", "rounds must be a whole number in 1..2147483647, got '0'"),
        ("env", "rounds must be a whole number in 1..2147483647, got '0'"),
        ("json", "rounds must be a whole number in 1..2147483647, got 0"),
        ("toml", "rounds must be a whole number in 1..2147483647, got 0"),
    ],
)
def test_a_wrong_value_is_one_line_naming_the_setting_from_every_source(
    source: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--insecure"]
    if source == "flag":
        argv += ["--rounds", "0"]
    elif source == "env":
        monkeypatch.setenv("FEDSV_ROUNDS", "0")
    else:
        config = tmp_path / f"run.{source}"
        config.write_text('{"rounds": 0}' if source == "json" else "rounds = 0\n")
        argv += ["--config", str(config)]
    with pytest.raises(ValueError) as caught:
        _load(CoordinatorSettings, argv)
    assert str(caught.value) == needle


@pytest.mark.parametrize("process", PROCESSES, ids=lambda p: p.__name__)
def test_help_names_every_setting_with_its_default_as_typed(process: type[ProcessSettings]) -> None:
    parser = argparse.ArgumentParser()
    add_settings(parser, process)
    text = " ".join(parser.format_help().split())
    for name, field in process.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in text, flag
        if isinstance(field.default, Enum):  # the value one types, not the enum's name
            assert f"(default: {field.default.value})" in text, flag
            assert f"{flag} {'|'.join(str(m.value) for m in type(field.default))}" in text, flag
        if isinstance(field.default, bool):
            assert "--no-" + flag[2:] in text, flag


def test_a_variable_that_names_no_setting_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FEDSV_ROUDNS", "10")
    monkeypatch.setenv("FEDSV_WORLD_SIZE", "4")  # a participant's setting: known, not the coordinator's
    with caplog.at_level("WARNING"):
        settings = _load(CoordinatorSettings, ["--insecure"])
    assert settings.rounds == 5
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["FEDSV_ROUDNS names no fedsv setting; ignored"]


@pytest.mark.parametrize("key", ["colour", "_secrets_dir", "_env_prefix", "_cli_settings_source"])
def test_a_file_sets_settings_only(key: str, tmp_path: Path) -> None:
    """A key of a config file that is no setting is refused, pydantic-settings' own keywords included
    (a file must not move where secrets or variables are read from)."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"rounds": 2, key: "/"}))
    with pytest.raises(ValueError, match=f"unknown setting '{key}'"):
        _load(CoordinatorSettings, ["--insecure", "--config", str(config)])


def test_a_setting_added_later_at_its_default_leaves_a_recorded_run_resumable(tmp_path: Path) -> None:
    """A run recorded before valuation_merge_redundant (or update_norm_reject_multiple) existed ran
    without merging, its default: the same settings now give the same record and run id, so its ledger
    resumes; merging on is recorded."""
    from fedsv.coordinator.server import run_id_of

    later = {"valuation_merge_redundant", "update_norm_reject_multiple"}
    assert all(added_later(name) for name in later) and not added_later("rounds")
    run = RunConfig(participants=6)
    before = {k: v for k, v in run.model_dump().items() if k not in later}
    assert run.to_dict() == before
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run(run_id_of(run), before)  # as the run was recorded before the setting
        ledger.ensure_run(run_id_of(RunConfig(participants=6)), RunConfig(participants=6).to_dict())
        merging = RunConfig(participants=6, valuation_merge_redundant=True)
        assert merging.to_dict()["valuation_merge_redundant"] is True
        with pytest.raises(LedgerError, match="valuation_merge_redundant"):
            ledger.ensure_run(run_id_of(merging), merging.to_dict())
