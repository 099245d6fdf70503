"""Every setting's one declaration by name, and the dataclass fields and checks drawn from it."""

from __future__ import annotations

import argparse
import dataclasses
from enum import Enum, StrEnum
from typing import Any

from fedsv.settings.declaration import Section, Setting
from fedsv.settings.process_settings import PROCESS_SETTINGS
from fedsv.settings.run_settings import RUN_SETTINGS


def _registry() -> dict[str, Setting]:
    both = set(RUN_SETTINGS) & set(PROCESS_SETTINGS)
    if both:
        raise RuntimeError(f"settings declared twice: {sorted(both)}")
    return {**RUN_SETTINGS, **PROCESS_SETTINGS}


SCHEMA: dict[str, Setting] = _registry()
"""Every declared setting by name."""


def setting(name: str, *, default: Any = dataclasses.MISSING, why: str = "") -> Any:
    """The dataclass field of setting `name`: its declared default and help.

    A class whose users need another default passes it with `why`, which help then shows; a changed
    default without a reason is an error (tests/unit/test_settings_schema.py also looks for them)."""
    declared = SCHEMA[name]
    value = declared.default if default is dataclasses.MISSING else default
    if value != declared.default and not why:
        raise ValueError(f"setting {name!r}: a default other than {declared.default!r} needs a reason (why=)")
    shown = value.value if isinstance(value, Enum) else value
    help_text = declared.help + (f"; {shown!r} here: {why}" if why else "")
    return dataclasses.field(default=value, metadata={"help": help_text, "setting": name})


def setting_list(name: str, *, default: str, only: tuple[StrEnum, ...] = (), note: str = "") -> Any:
    """A field holding a comma list of setting `name`'s choices (`only` these, if given): a study's
    settings to sweep."""
    declared = SCHEMA[name]
    assert declared.choices is not None, f"{name} has no choices to list"
    allowed = " | ".join(m.value for m in (only or tuple(declared.choices)))
    help_text = f"a comma list of {name}s to run: {allowed}" + (f" ({note})" if note else "")
    return dataclasses.field(default=default, metadata={"help": help_text, "setting": name, "list": True})


def add_setting_argument(parser: argparse.ArgumentParser, name: str, *, required: bool = False) -> None:
    """`--name` for a command that takes one setting on its own (e.g. `fedsv certs --participants`):
    its type, help and range from the schema."""
    declared = SCHEMA[name]

    def parse(text: str) -> Any:
        value = type(declared.default)(text)
        if declared.range is not None:
            try:
                declared.range(name, value)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    default = None if required else declared.default
    parser.add_argument(
        "--" + name.replace("_", "-"), type=parse, required=required, default=default, help=declared.help
    )


def check_settings(config: Any) -> None:
    """Coerce every enum setting of a config dataclass to its enum and check every declared range;
    a ValueError naming the setting otherwise."""
    for field in dataclasses.fields(config):
        name = field.metadata.get("setting")
        if name is None or field.metadata.get("list"):
            continue
        declared = SCHEMA[name]
        value = getattr(config, field.name)
        if declared.choices is not None:
            try:
                value = declared.choices(value)
            except ValueError:
                allowed = [m.value for m in declared.choices]
                raise ValueError(f"{field.name} must be one of {allowed}, got {value!r}") from None
            object.__setattr__(config, field.name, value)
        if declared.range is not None:
            declared.range(field.name, value)


__all__ = [
    "Section",
    "Setting",
    "add_setting_argument",
    "check_settings",
    "setting",
    "setting_list",
]
