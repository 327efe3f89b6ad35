"""The ``cron:`` and ``heartbeat:`` sections: when scheduled jobs and the periodic
heartbeat turn run.

Separate from the root ``Config`` (``gateway/kernel/config.py``), which re-exports both, so
the schedule settings and their time checks read on their own.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import field_validator

from gateway.kernel.config_fields import Duration, Section, check_target


def _check_timezone(value: str | None) -> str | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if value is not None:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA timezone {value!r}") from exc
    return value


class CronConfig(Section):
    """``gateway/cron.py``: scheduled reminders and agent tasks, stored in the database."""

    enabled: bool = True
    timezone: str | None = None
    """For naive ``at`` times and cron expressions without ``tz``; None: ``agent.timezone``."""
    missed_grace: Duration = 600.0
    """A run missed while the gateway was down still runs at start if at most this late."""
    poll_interval: Duration = 5.0
    """How often a running gateway looks for jobs added by ``parley cron`` (another process)."""
    min_interval: Duration = 60.0
    """Shortest ``every`` the gateway accepts: no job may flood a chat."""

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str | None) -> str | None:
        return _check_timezone(value)

    @field_validator("poll_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be more than 0")
        return value


_HOURS = re.compile(r"^\s*([01]?\d|2[0-4]):([0-5]\d)\s*-\s*([01]?\d|2[0-4]):([0-5]\d)\s*$")


class HeartbeatConfig(Section):
    """``gateway/heartbeat.py``: a periodic turn over HEARTBEAT.md's tasks. Off by default:
    every beat with tasks costs a model call."""

    enabled: bool = False
    every: Duration = 1800.0
    active_hours: str | None = "08:00-22:00"
    """``HH:MM-HH:MM`` in the cron timezone (``22:00-06:00`` spans midnight); None: always."""
    target: str = "none"
    """Where an alert goes: ``channel:chat_id``, or ``none`` (the turn runs, nothing is sent)."""

    @field_validator("every")
    @classmethod
    def _at_least_a_minute(cls, value: float) -> float:
        if value < 60:
            raise ValueError("must be at least 1m")
        return value

    @field_validator("active_hours", mode="before")
    @classmethod
    def _hours(cls, value: Any) -> Any:
        if value in (None, ""):
            return None
        match = _HOURS.match(str(value))
        if not match or any(int(h) == 24 and m != "00"
                            for h, m in (match.group(1, 2), match.group(3, 4))):
            raise ValueError(f"{value!r} is not a span of hours; write it like 08:00-22:00")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return value if value == "none" else check_target(value)

    def hours(self) -> tuple[int, int] | None:
        """(start, end) in minutes after midnight, or None for all day."""
        if self.active_hours is None:
            return None
        match = _HOURS.match(self.active_hours)
        assert match is not None
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        return h1 * 60 + m1, h2 * 60 + m2
