"""The value types and checks every config section shares: durations (``90s``, ``2h``),
"blank means unset" strings and secrets, id lists written as YAML numbers, and the frozen
``Section`` base that turns an unknown key into an error naming its path.

Separate so the section modules (agent, channels, schedules) can share them without importing
one another or the root ``Config``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*")
_COMPOUND = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d)\s*){2,}$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """``90s``, ``30m``, ``2h``, ``1.5d``, ``1h30m`` or a bare number of seconds → seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 30m or 2h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
        elif _COMPOUND.match(str(value)):  # 1h30m, 1d 12h
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(str(value)))
        else:
            raise ValueError(f"{value!r} is not a duration; write it like 90s, 30m, 2h or "
                             "1h30m")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _blank_is_none(value: Any) -> Any:
    """An empty value means "not set": what ``${VAR:-}`` gives when VAR is unset."""
    return None if value == "" else value


def _ids_as_text(value: Any) -> Any:
    """Ids are numbers in YAML (``- 123456``); kept as text like the usernames beside them."""
    if isinstance(value, list):
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


OptionalStr = Annotated[str | None, BeforeValidator(_blank_is_none)]
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_blank_is_none)]
IdList = Annotated[list[str], BeforeValidator(_ids_as_text)]


class Section(BaseModel):
    """A config section: unknown keys are errors, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_target(value: str) -> str:
    """``channel:chat_id`` (the chat id may itself hold colons)."""
    channel, _, chat_id = value.partition(":")
    if not channel or not chat_id:
        raise ValueError(f"{value!r} is not a target; write it as channel:chat_id "
                         "(e.g. telegram:123456789)")
    return value

