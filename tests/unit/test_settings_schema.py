"""Every setting is declared once (fedsv.settings), and round-trips through flags, JSON files and the wire."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

import fedsv
from fedsv.app.demo import DemoConfig
from fedsv.app.launch import LaunchConfig
from fedsv.app.study.config import StudyConfig
from fedsv.config.flags import add_dataclass_args, build_config, load_config_file
from fedsv.coordinator.server_config import ServerConfig
from fedsv.ledger import Ledger, LedgerError
from fedsv.participant.config import ParticipantConfig
from fedsv.settings.run import RunConfig
from fedsv.settings.run_spec import CARRIED, from_run_spec, to_run_spec
from fedsv.settings.schema import SCHEMA, setting

PACKAGE = Path(fedsv.__file__).parent
CONFIGS: list[type[Any]] = [RunConfig, ServerConfig, LaunchConfig, ParticipantConfig, StudyConfig, DemoConfig]

LIBRARY_API = {
    ("ValuationSpec", "eps"): "fedsv.valuation's own API, used without a run",
    ("ValuationSpec", "delta"): "fedsv.valuation's own API, used without a run",
    ("ValuationSpec", "seed"): "fedsv.valuation's own API, used without a run",
    ("Settings", "eps"): "an estimator's own settings (fedsv.valuation.games.estimator)",
    ("Settings", "delta"): "an estimator's own settings (fedsv.valuation.games.estimator)",
    ("Settings", "seed"): "an estimator's own settings (fedsv.valuation.games.estimator)",
    ("GameSettings", "metric"): "fedsv.valuation's round game, used without a run",
    ("TrainConfig", "lr"): "the task layer's local training, used by tasks without a run",
    ("PaperTask", "model"): "the built-in task's own constructor",
    ("PaperTask", "metric"): "the built-in task's own constructor",
}
"""Dataclasses below the settings that keep a default equal to a setting's: the libraries' own Python API.
A run always passes the setting's value to them."""


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)


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
                    if name in SCHEMA and literal == SCHEMA[name].default:
                        found.append(
                            f"{path}: flag --{first.value.lstrip('-')} repeats the setting's default"
                        )
            if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
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
                if settings_class and _uses(value, "field"):
                    plain_fields.setdefault(name, []).append(where)
                try:
                    literal = ast.literal_eval(value)
                except ValueError:
                    continue
                declared = SCHEMA[name].default if name in SCHEMA else None
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
        "@dataclass\nclass Holder:\n    validation_size: int = 1000\n",
        "parser.add_argument('--give-up-after', type=float, default=600.0)\n",
        "parser.add_argument('--data-dir', default='')\n",
        "@dataclass\nclass A:\n    a: int = setting('rounds')\n    knob: int = field(default=1)\n"
        "@dataclass\nclass B:\n    b: int = setting('rounds')\n    knob: int = field(default=2)\n",
    ],
)
def test_the_scan_finds_a_second_declaration(snippet: str) -> None:
    assert second_declarations({"x.py": snippet}), snippet


def test_a_changed_default_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        setting("rounds", default=7)
    assert "7 here: a study" in setting("rounds", default=7, why="a study").metadata["help"]


def test_every_declared_setting_is_used_and_every_config_field_is_one() -> None:
    used = {
        f.metadata["setting"] for cls in CONFIGS for f in dataclasses.fields(cls) if "setting" in f.metadata
    }
    assert used == set(SCHEMA)
    for cls in (RunConfig, ServerConfig, ParticipantConfig):
        assert all("setting" in f.metadata for f in dataclasses.fields(cls)), cls


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
}
BASES: dict[type[Any], dict[str, Any]] = {
    RunConfig: {"dataset": "mnist"},
    DemoConfig: {"dataset": "mnist"},
    StudyConfig: {"dataset": "mnist"},
    ServerConfig: {"insecure": True},
    LaunchConfig: {},
    ParticipantConfig: {"coordinator": "host:1", "insecure": True},
}
NEEDS: dict[str, dict[str, Any]] = {
    "task": {"validation_data": "val.npz"},
    "tls_dir": {"insecure": False},
    "dataset": {"validation_from": "train"},
}


def _sample(cls: type[Any], field: dataclasses.Field[Any]) -> Any:
    name = field.name
    if name in SAMPLES and SAMPLES[name] != field.default:
        return SAMPLES[name]
    default = field.default
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
    return [(cls, f.name) for cls in CONFIGS for f in dataclasses.fields(cls) if f.metadata.get("setting")]


@pytest.mark.parametrize(("cls", "name"), _cases(), ids=lambda v: getattr(v, "__name__", v))
def test_every_setting_round_trips_through_flags_json_and_the_wire(
    cls: type[Any], name: str, tmp_path: Path
) -> None:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = _sample(cls, field)
    others = {**BASES[cls], **{k: v for k, v in NEEDS.get(name, {}).items() if k in BASES[cls] or k != name}}
    others = {k: v for k, v in others.items() if k != name and k in {f.name for f in dataclasses.fields(cls)}}
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, cls)
    flag = "--" + name.replace("_", "-")

    def flags(values: dict[str, Any]) -> list[str]:
        out: list[str] = []
        for key, v in values.items():
            option = "--" + key.replace("_", "-")
            out += [option if v else "--no-" + option[2:]] if isinstance(v, bool) else [option, str(v)]
        return out

    from_flags = build_config(cls, parser.parse_args(flags({**others, name: value})))
    assert getattr(from_flags, name) == value, flag
    config_file = tmp_path / "settings.json"
    config_file.write_text(json.dumps({**others, name: value}))
    from_json = build_config(cls, parser.parse_args([]), load_config_file(config_file))
    assert getattr(from_json, name) == value
    assert from_json == from_flags
    if cls is RunConfig and name in CARRIED:
        wire = from_run_spec(to_run_spec(from_flags, "run-x", "none", 1 << 20))
        assert getattr(wire, name) == value
        assert {n: getattr(wire, n) for n in CARRIED} == {n: getattr(from_flags, n) for n in CARRIED}


def test_a_setting_added_later_at_its_default_leaves_a_recorded_run_resumable(tmp_path: Path) -> None:
    """A run recorded before valuation_merge_redundant existed ran without merging, its default: the
    same settings now give the same record and run id, so its ledger resumes; merging on is recorded."""
    from fedsv.coordinator.server import run_id_of

    assert SCHEMA["valuation_merge_redundant"].later
    run = RunConfig(participants=6)
    before = {k: v for k, v in dataclasses.asdict(run).items() if k != "valuation_merge_redundant"}
    assert run.to_dict() == before
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run(run_id_of(run), before)  # as the run was recorded before the setting
        ledger.ensure_run(run_id_of(RunConfig(participants=6)), RunConfig(participants=6).to_dict())
        merging = RunConfig(participants=6, valuation_merge_redundant=True)
        assert merging.to_dict()["valuation_merge_redundant"] is True
        with pytest.raises(LedgerError, match="valuation_merge_redundant"):
            ledger.ensure_run(run_id_of(merging), merging.to_dict())
