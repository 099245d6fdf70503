"""The base of every config class: a frozen pydantic model that refuses unknown settings in one line."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from fedsv.settings.errors import SettingsError, one_line

C = TypeVar("C", bound="ConfigModel")


class ConfigModel(BaseModel):
    """Settings of one concern (the run, the server, a participant, a launch, a study): frozen, every
    field checked on construction, an unknown name an error, each error one line naming the setting
    (SettingsError, a ValueError)."""

    # typed as pydantic-settings' config, so that a process's settings (a BaseSettings) may derive from it
    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(frozen=True, extra="forbid")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(one_line(exc, type(self))) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_truth_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 for a number; a file saying `"rounds": true` is a mistake, not 1."""
        if isinstance(value, bool) and info.field_name is not None:
            kind = cls.model_fields[info.field_name].annotation
            if kind in (int, float, int | None, float | None):
                raise ValueError(f"must be a number, got {value!r}")
        return value

    def changed(self: C, **changes: Any) -> C:
        """A copy with `changes`, checked as a new config is (pydantic's model_copy does not check)."""
        return type(self)(**{**self.model_dump(), **changes})

    def part(self, cls: type[C]) -> C:
        """The settings of `cls` among this config's (a process's settings hold several classes')."""
        return cls(**{name: getattr(self, name) for name in cls.model_fields})
