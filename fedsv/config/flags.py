"""Config dataclasses as command-line flags and JSON files: a --flag per field, types checked by pydantic."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")

_SCALARS = (int, float, str, bool)


def _bare(kind: Any) -> Any:
    """`X` of `X | None`; any other type as it is."""
    if get_origin(kind) in (Union, types.UnionType):
        rest = [arg for arg in get_args(kind) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else kind
    return kind


def _default_note(default: Any) -> str:
    """ " (default: X)" for help, nothing where there is no default to show (None or "")."""
    return "" if default is None or default == "" else f" (default: {default})"


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add `--field-name` for every scalar or enum field of the dataclass (defaults shown in --help)."""
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = _bare(hints[field.name])
        choices = (
            [member.value for member in kind] if isinstance(kind, type) and issubclass(kind, Enum) else None
        )
        if kind not in _SCALARS and choices is None:
            continue
        flag = "--" + field.name.replace("_", "-")
        default = field.default if field.default is not dataclasses.MISSING else None
        shown = default.value if isinstance(default, Enum) else default
        help_text = field.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(
                flag, dest=field.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif choices is not None:  # checked by the config, whose error names the setting and its choices
            parser.add_argument(
                flag,
                dest=field.name,
                default=None,
                metavar="|".join(choices),
                help=f"{help_text}{_default_note(shown)}",
            )
        else:
            parser.add_argument(
                flag,
                dest=field.name,
                type=kind,
                default=None,
                metavar=kind.__name__.upper(),
                help=f"{help_text}{_default_note(shown)}".strip(),
            )


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON config file of field -> value; a clear error if it is not a JSON object."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise ValueError(f"config file {p} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"config file {p} is not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a JSON object of settings")
    return data


def checked_values(cls: type[Any], values: dict[str, Any]) -> dict[str, Any]:
    """The values of a config file, each of its field's exact type (pydantic, strict: no "0.5" for a
    float, no "false" for a bool, no 1.0 for an int; an int is a valid float). ValueError naming the
    first setting that is wrong, in one line."""
    hints = get_type_hints(cls)
    out: dict[str, Any] = {}
    for name, value in values.items():
        kind = hints[name]
        bare = _bare(kind)
        if isinstance(bare, type) and issubclass(bare, Enum):
            kind = bare = str  # an enum setting is given by its value; the config names the choices
        try:
            out[name] = TypeAdapter(kind).validate_python(value, strict=True)
        except ValidationError as exc:
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            expected = getattr(bare, "__name__", str(kind))
            reason = exc.errors()[0]["msg"].lower()
            raise ValueError(f"config setting {name!r} must be {expected}, got {shown} ({reason})") from None
        if isinstance(out[name], float) and kind is float:
            out[name] = float(out[name])
    return out


def build_config(cls: type[T], args: argparse.Namespace, file_values: dict[str, Any] | None = None) -> T:
    """Defaults < config file < command-line flags; unknown keys in the file are an error."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    if file_values:
        unknown = sorted(set(file_values) - names)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid keys: {sorted(names)}")
        values.update(checked_values(cls, file_values))
    for name in names:
        flag_value = getattr(args, name, None)
        if flag_value is not None:
            values[name] = flag_value
    return cls(**values)


def build_configs(args: argparse.Namespace, file_values: dict[str, Any], *classes: type[Any]) -> list[Any]:
    """One config file split over several dataclasses (each key goes to the class that has it)."""
    names = [{f.name for f in dataclasses.fields(cls)} for cls in classes]
    unknown = sorted(set(file_values) - set().union(*names))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}")
    return [
        build_config(cls, args, {k: v for k, v in file_values.items() if k in keys})
        for cls, keys in zip(classes, names, strict=True)
    ]
