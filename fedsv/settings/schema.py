"""Every setting's one declaration by name (a pydantic field), and the field a config class takes from it."""

from __future__ import annotations

import copy
from enum import Enum
from typing import Any

from pydantic import Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from fedsv.settings.errors import SettingsError, one_line
from fedsv.settings.process_settings import PROCESS_SETTINGS
from fedsv.settings.run_settings import RUN_SETTINGS

_UNSET: Any = object()


def _registry() -> dict[str, FieldInfo]:
    both = set(RUN_SETTINGS) & set(PROCESS_SETTINGS)
    if both:
        raise RuntimeError(f"settings declared twice: {sorted(both)}")
    declared = {**RUN_SETTINGS, **PROCESS_SETTINGS}
    assert all(isinstance(field, FieldInfo) for field in declared.values())
    return declared


SCHEMA: dict[str, FieldInfo] = _registry()
"""Every declared setting by name: its default, range (pydantic's constraints) and description."""


def setting(name: str, *, default: Any = _UNSET, why: str = "") -> Any:
    """The pydantic field of setting `name` for a config class: its declared default, range and help.

    A class whose users need another default passes it with `why`, which help then shows; a changed
    default without a reason is an error (tests/unit/test_settings_schema.py also looks for them)."""
    declared = SCHEMA[name]
    value = declared.default if default is _UNSET else default
    if value != declared.default and not why:
        raise ValueError(f"setting {name!r}: a default other than {declared.default!r} needs a reason (why=)")
    field = copy.deepcopy(declared)  # each class its own field: pydantic completes the one it is given
    if why:
        shown = value.value if isinstance(value, Enum) else value
        field.default = value
        field.description = f"{declared.description}; {shown!r} here: {why}"
        field._attributes_set.update(default=value, description=field.description)
    return field


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
    field: dict[str, Any] = {name: (type(SCHEMA[name].default), setting(name))}
    model = create_model("OneSetting", **field)
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
    "SCHEMA",
    "added_later",
    "checked_setting",
    "declared_default",
    "earlier_value",
    "setting",
    "setting_list",
]
