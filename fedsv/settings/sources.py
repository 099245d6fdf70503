"""A process's settings from flags, a --config file (JSON or TOML) and FEDSV_* variables (pydantic-settings).

Precedence: flags > the --config file > FEDSV_* environment variables > the declared defaults."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tomllib
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    JsonConfigSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fedsv.settings.errors import SettingsError, one_line
from fedsv.settings.schema import SCHEMA

logger = logging.getLogger(__name__)

ENV_PREFIX = "FEDSV_"
"""Every setting NAME is read from the environment variable FEDSV_NAME (upper case)."""

S = TypeVar("S", bound="ProcessSettings")


class ProcessSettings(BaseSettings):
    """The one model of a process's settings: its config classes as bases, read from every source."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_exit_on_error=False,
    )


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings of a JSON or (by its .toml suffix) TOML file; a one-line error if it is missing or
    not an object of settings."""
    file = Path(path)
    if not file.is_file():
        raise SettingsError(f"config file {file} does not exist")
    toml = file.suffix.lower() == ".toml"
    try:
        source = (
            TomlConfigSettingsSource(ProcessSettings, toml_file=file)
            if toml
            else JsonConfigSettingsSource(ProcessSettings, json_file=file)
        )
        return dict(source.toml_data if isinstance(source, TomlConfigSettingsSource) else source.json_data)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"config file {file} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {file} is not valid TOML: {exc}") from None
    except (TypeError, ValueError, AttributeError):  # a list or a number at the top
        kind = "TOML table" if toml else "JSON object"
        raise SettingsError(f"config file {file} must hold a {kind} of settings") from None


def _choices(annotation: Any) -> list[str] | None:
    kinds = [annotation, *get_args(annotation)]
    for kind in kinds:
        if isinstance(kind, type) and issubclass(kind, Enum):
            return [str(member.value) for member in kind]
    return None


def add_settings(parser: argparse.ArgumentParser, model: type[ProcessSettings]) -> CliSettingsSource[Any]:
    """`--config FILE` and a flag per setting of `model` on `parser`; the source load_settings reads."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a JSON or .toml file of settings; flags override it, and it overrides FEDSV_* environment "
        "variables (FEDSV_ROUNDS=10 sets --rounds)",
    )
    source: CliSettingsSource[Any] = CliSettingsSource(
        model, root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True, cli_exit_on_error=False
    )
    flags = {action.dest: action for action in parser._actions}
    for name, field in model.model_fields.items():  # choices and defaults as users type them
        flag = flags.get(name)
        if flag is None:
            continue
        choices = _choices(field.annotation)
        if choices:
            flag.metavar = "|".join(choices)
        if isinstance(field.default, Enum) and flag.help:
            flag.help = flag.help.replace(
                f"(default: {field.default.name})", f"(default: {field.default.value})"
            )
        if field.default == "" and flag.help:
            flag.help = flag.help.replace("(default: )", "(default: '')")
    return source


def unknown_variables(model: type[ProcessSettings], environ: dict[str, str] | None = None) -> list[str]:
    """The FEDSV_* variables that name no setting (of this process, or any declared one): a typo such as
    FEDSV_ROUDNS would otherwise be ignored without a word."""
    names = set(SCHEMA) | set(model.model_fields)
    return sorted(
        key
        for key in (os.environ if environ is None else environ)
        if key.upper().startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() not in names
    )


def load_settings(model: type[S], source: CliSettingsSource[Any], args: argparse.Namespace) -> S:
    """`model` from the parsed flags, the --config file and the environment; SettingsError in one line."""
    file_values = read_config_file(args.config) if getattr(args, "config", None) else {}
    for name in unknown_variables(model):
        logger.warning("%s names no fedsv setting; ignored", name)
    unknown = sorted(set(file_values) - set(model.model_fields))
    if unknown:  # checked here: BaseSettings takes "_"-keys (_secrets_dir, _env_prefix...) as its own
        raise SettingsError(f"unknown setting {unknown[0]!r} in {args.config}")
    try:
        build: Any = model  # BaseSettings takes its sources as keywords that are not fields
        settings: S = build(_cli_settings_source=source(parsed_args=args), **file_values)
        return settings
    except ValidationError as exc:
        raise SettingsError(one_line(exc, model)) from None
