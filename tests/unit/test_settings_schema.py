"""Every setting is declared once (fedsv.settings) and round-trips through flags, files, FEDSV_*, the wire."""

from __future__ import annotations

import argparse
import json
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from pydantic_core import PydanticUndefined

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
from fedsv.settings import process_settings, run_settings
from fedsv.settings.model import ConfigModel
from fedsv.settings.run import RunConfig
from fedsv.settings.run_spec import CARRIED, from_run_spec, to_run_spec
from fedsv.settings.schema import ALIASES, DECLARED, SCHEMA, added_later, changed
from fedsv.settings.sources import ENV_PREFIX, ProcessSettings, add_settings, load_settings

PACKAGE = Path(fedsv.__file__).parent
CONFIGS: list[type[Any]] = [RunConfig, ServerConfig, LaunchConfig, ParticipantConfig, StudyConfig, DemoConfig]
PROCESSES: list[type[ProcessSettings]] = [
    CoordinatorSettings, ParticipantSettings, LaunchSettings, DemoSettings, StudySettings
]  # fmt: skip
"""The one settings model of each process: `python -m fedsv.coordinator`, `python -m fedsv.participant`,
`fedsv launch`, `fedsv demo`, `fedsv study`."""


def _config_classes() -> list[type[ConfigModel]]:
    """Every config class (a ConfigModel below the processes' settings), the listed ones and any other."""
    found, todo = [], list(ConfigModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if not issubclass(cls, ProcessSettings) and cls.__module__.startswith("fedsv."):
            found.append(cls)
    return found


def test_each_setting_is_declared_once_as_an_alias_named_for_it() -> None:
    assert set(ALIASES) == set(SCHEMA) and len(SCHEMA) > 80
    assert set(vars(run_settings)) & set(ALIASES) and set(vars(process_settings)) & set(ALIASES)
    # an alias is a whole declaration: type, default and help (a shared range such as Seconds is not one)
    for name, field in SCHEMA.items():
        assert field.annotation is not None and field.description, name
        assert field.default is not PydanticUndefined, name
    assert "Seconds" not in SCHEMA and SCHEMA["round_timeout"].metadata == SCHEMA["give_up_after"].metadata
    assert SCHEMA["rank"].annotation == int | None  # the type sits beside its default (None)


def test_a_changed_default_needs_a_reason_and_says_it() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        changed(run_settings.rounds, 7, why="")
    field = changed(run_settings.rounds, 7, why="a study")
    assert field.default == 7 and field.description == "training rounds T; 7 here: a study"
    assert SCHEMA["rounds"].default == 5  # the declaration itself is untouched


def misdeclared(classes: list[type[ConfigModel]]) -> list[str]:
    """Fields of `classes` named as a setting that are not that setting: another type, range or help, or
    another default without its reason in help."""
    found = []
    for cls in classes:
        for name, field in cls.model_fields.items():
            if name not in SCHEMA or (field.description or "").startswith("a comma list of"):  # a sweep
                continue
            declared, where = SCHEMA[name], f"{cls.__name__}.{name}"
            if (field.annotation, field.metadata) != (declared.annotation, declared.metadata):
                found.append(f"{where}: not the setting's type and range")
            elif field.default == declared.default and field.description != declared.description:
                found.append(f"{where}: not the setting's help")
            elif field.default != declared.default and not (
                (field.description or "").startswith(f"{declared.description}; ")
                and " here: " in (field.description or "")
            ):
                found.append(f"{where}: another default without its reason")
    return found


def test_every_declared_setting_is_used_and_every_config_field_is_one() -> None:
    classes = _config_classes()
    assert set(CONFIGS) <= set(classes)
    used = {name for cls in classes for name in cls.model_fields if name in SCHEMA}
    assert used == set(SCHEMA)
    for cls in (RunConfig, ServerConfig, ParticipantConfig):
        assert set(cls.model_fields) <= set(SCHEMA), cls
    assert misdeclared(classes) == []
    for process in PROCESSES:  # each process's one model holds every field of its configs
        bases = [base for base in process.__mro__ if base in CONFIGS]
        assert bases and set(process.model_fields) == set().union(*(b.model_fields for b in bases)), process


def test_a_field_that_copies_a_setting_is_found() -> None:
    class Copy(ConfigModel):
        rounds: int = Field(default=5, description="training rounds T")  # no range: a copy

    class Unexplained(ConfigModel):
        rounds: run_settings.rounds = Field(default=7)  # another default, no reason

    class Retold(ConfigModel):
        rounds: run_settings.rounds = Field(default=5, description="rounds")  # its own help

    class Explained(ConfigModel):
        rounds: run_settings.rounds = changed(run_settings.rounds, 7, why="a study")
        lr: run_settings.lr = DECLARED

    assert [len(misdeclared([cls])) for cls in (Copy, Unexplained, Retold, Explained)] == [1, 1, 1, 0]
    assert Explained().rounds == 7 and Explained().lr == 0.05


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
