"""A pydantic validation error as one line for the user, naming the setting and what it must be."""

from __future__ import annotations

from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError

_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "text",
}


def _shown(value: Any) -> str:
    text = repr(value.value if hasattr(value, "value") and not isinstance(value, str) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _range(model: type[BaseModel] | None, name: str, error: dict[str, Any]) -> str:
    """What the setting's range is: all of its declared bounds, not only the one it broke."""
    field = model.model_fields.get(name) if model is not None else None
    bounds = {type(m): m for m in (field.metadata if field is not None else [])}
    ge, gt, le, lt = (bounds.get(kind) for kind in (Ge, Gt, Le, Lt))
    low = (ge.ge, "[") if isinstance(ge, Ge) else (gt.gt, "(") if isinstance(gt, Gt) else None
    high = (le.le, "]") if isinstance(le, Le) else (lt.lt, ")") if isinstance(lt, Lt) else None
    whole = field is not None and field.annotation in (int, int | None)
    if low is not None and high is not None:
        if whole:
            return f"a whole number in {low[0]}..{high[0]}"
        return f"in {low[1]}{low[0]}, {high[0]}{high[1]}"
    if low is not None and low[0] == 0:
        return "a positive finite number" if low[1] == "(" else "0 or a positive finite number"
    if low is not None:
        return f"{'at least' if low[1] == '[' else 'more than'} {low[0]}"
    if high is not None:
        return f"{'at most' if high[1] == ']' else 'less than'} {high[0]}"
    return str(error["msg"]).lower()


def _rule(model: type[BaseModel] | None, name: str, error: dict[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _range(model, name, error)
    if kind == "finite_number":
        return _range(model, name, error).replace("input should be a finite number", "a finite number")
    if kind in ("enum", "literal_error"):
        return f"one of {ctx.get('expected', '')}"
    for prefix, words in _KINDS.items():
        if kind.startswith(prefix):
            return words
    return error["msg"][0].lower() + error["msg"][1:]


def one_line(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """ "NAME must be RULE, got VALUE" for the first error (and how many more there are); a check of
    several settings (a model validator) says its own sentence."""
    errors = exc.errors()
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    loc = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return f"unknown setting {loc!r}{more}"
    if first["type"] == "value_error" and not loc:
        return str(first["msg"]).removeprefix("Value error, ") + more
    if first["type"] == "value_error":
        said = str(first["msg"]).removeprefix("Value error, ")
        return f"{loc} {said}{more}" if said.startswith("must be") else f"{loc}: {said}{more}"
    return f"{loc} must be {_rule(model, loc, dict(first))}, got {_shown(first['input'])}{more}"


class SettingsError(ValueError):
    """Settings that cannot run, in one line naming the setting."""
