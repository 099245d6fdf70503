"""Every setting's one declaration by name (from its `Annotated` alias), and a changed default's field."""

from __future__ import annotations

from enum import Enum
from types import ModuleType
from typing import Annotated, Any, get_args, get_origin

from pydantic import Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fedsv.settings import process_settings, run_settings
from fedsv.settings.errors import SettingsError, one_line


def _declared(*modules: ModuleType) -> dict[str, Any]:
    """The settings' aliases of `modules`: each module-level `name: TypeAlias = Annotated[..., Field(...)]`
    with a description (a shared range such as kinds.Seconds has none, and is no setting)."""
    found: dict[str, Any] = {}
    for module in modules:
        for name, alias in vars(module).items():
            if name.startswith("_") or get_origin(alias) is not Annotated:
                continue
            fields = [m for m in get_args(alias)[1:] if isinstance(m, FieldInfo)]
            if not any(f.description for f in fields):
                continue
            if name in found:
                raise RuntimeError(f"setting {name!r} declared twice")
            found[name] = alias
    return found


ALIASES: dict[str, Any] = _declared(run_settings, process_settings)
"""Every declared setting's alias by name: `rs.rounds` is ALIASES["rounds"]."""

SCHEMA: dict[str, FieldInfo] = {name: FieldInfo.from_annotation(alias) for name, alias in ALIASES.items()}
"""Every declared setting by name: its type, default, range (pydantic's constraints) and description."""


DECLARED: Any = PydanticUndefined
"""A config class's field at its alias's declared default: `rounds: rs.rounds = DECLARED` (pydantic reads the
default inside the alias; the assignment tells type checkers that the field has one)."""


def changed(alias: Any, value: Any, *, why: str) -> Any:
    """The field of a config class whose users need another default than its alias declares: `value`,
    with `why` in its help (`fraction: rs.fraction = changed(rs.fraction, 0.25, why=...)`)."""
    declared = FieldInfo.from_annotation(alias)
    if not why:
        raise ValueError(f"a default other than {declared.default!r} needs a reason (why=)")
    shown = value.value if isinstance(value, Enum) else value
    return Field(default=value, description=f"{declared.description}; {shown!r} here: {why}")


def setting_list(name: str, *, default: str, only: tuple[Enum, ...] = (), note: str = "") -> Any:
    """A field holding a comma list of setting `name`'s choices (`only` these, if given): a study's
    settings to sweep."""
    declared = SCHEMA[name].default
    assert isinstance(declared, Enum), f"{name} has no choices to list"
    allowed = " | ".join(str(m.value) for m in (only or tuple(type(declared))))
    description = f"a comma list of {name}s to run: {allowed}" + (f" ({note})" if note else "")
    return Field(default=default, description=description)


def added_later(name: str) -> bool:
    """Whether setting `name` came after runs were recorded (json_schema_extra "later"): at the value
    that stands for the behaviour before it (earlier_value), it is left out of a run's record and id,
    so that those runs resume."""
    extra = SCHEMA[name].json_schema_extra
    return isinstance(extra, dict) and extra.get("later") not in (None, False)


def checked_setting(name: str, value: Any) -> Any:
    """`value` checked against setting `name`'s declared type and range (a command that takes one
    setting on its own, e.g. `fedsv certs --participants`); SettingsError in one line otherwise."""
    model = create_model("OneSetting", **{name: ALIASES[name]})
    try:
        return getattr(model.model_validate({name: value}), name)
    except ValidationError as exc:
        raise SettingsError(one_line(exc, model)) from None


def earlier_value(name: str) -> Any:
    """The value a setting added later stands for in the runs recorded before it (json_schema_extra
    "later": True, its default; or the value named there, where the default changed the behaviour)."""
    extra = SCHEMA[name].json_schema_extra
    later = extra.get("later") if isinstance(extra, dict) else None
    return SCHEMA[name].default if later is True else later


def declared_default(name: str) -> Any:
    """The default setting `name` is declared with."""
    return SCHEMA[name].default


__all__ = [
    "ALIASES",
    "DECLARED",
    "SCHEMA",
    "added_later",
    "changed",
    "checked_setting",
    "declared_default",
    "earlier_value",
    "setting_list",
]
