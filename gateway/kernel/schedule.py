"""When a scheduled job runs: ``at`` (once), ``every`` (a fixed interval) or ``cron``.

Pure functions of time, so they are tested without a gateway. Every time in and out is
timezone-aware; a naive ``at`` time is read in the job's timezone. Cron expressions are
evaluated in their IANA timezone with croniter, so ``0 9 * * *`` stays at 09:00 local across
daylight-saving changes. In the hour that repeats when clocks go back, a job with a fixed hour
runs once; one whose hour field starts with ``*`` runs in both passes (as Vixie cron does). A
time the spring change skips runs when the clocks reach it (02:30 becomes 03:00).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from gateway.kernel.config import parse_duration
from gateway.kernel.frozen import frozen

ScheduleKind = Literal["at", "every", "cron"]
_CRON_SCAN = 1000
"""Most skipped fold occurrences looked at before giving up on an expression."""


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message says what to write instead."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown IANA timezone {name!r} (e.g. Europe/Berlin, UTC)") \
            from None


_TIME_OF_DAY = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?$")


def next_time_of_day(hour: int, minute: int, second: int, tz: str, now: datetime) -> datetime:
    """The first ``hour:minute`` in ``tz`` after ``now`` (today, else tomorrow) → aware UTC.
    A time the spring change skips is read as the clocks read it after the change."""
    local = now.astimezone(zone(tz))
    for days in range(3):
        day = (local + timedelta(days=days)).date()
        when = datetime(day.year, day.month, day.day, hour, minute, second,
                        tzinfo=zone(tz)).astimezone(UTC)
        if when > now:
            return when
    raise ScheduleError(f"no {hour:02d}:{minute:02d} after {now.isoformat()}")  # unreachable


def parse_at(text: str, tz: str, now: datetime) -> datetime:
    """An ISO time (naive: in ``tz``), a time of day such as ``09:00`` (the next one, in
    ``tz``) or a delay from ``now`` such as ``20m`` or ``1h30m`` → aware UTC."""
    value = text.strip()
    try:
        return now + timedelta(seconds=parse_duration(value.removeprefix("+")))
    except ValueError:
        pass
    if match := _TIME_OF_DAY.match(value):
        return next_time_of_day(int(match.group(1)), int(match.group(2)),
                                int(match.group(3) or 0), tz, now)
    try:
        when = datetime.fromisoformat(value.replace(" ", "T", 1) if " " in value else value)
    except ValueError:
        raise ScheduleError(f"{text!r} is not a time; write 09:00 (the next one, in {tz}), "
                            "2025-06-01T09:00, 2025-06-01T09:00+02:00, or a delay such as 20m "
                            "or 1h30m") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone(tz))
    return when.astimezone(UTC)


@frozen
class Schedule:
    kind: ScheduleKind
    spec: str
    """``at``: aware ISO time (UTC); ``every``: seconds; ``cron``: the expression."""
    tz: str
    anchor: datetime
    """``every`` counts its intervals from here (the job's creation)."""

    @classmethod
    def parse(cls, kind: str, text: str, *, tz: str, now: datetime,
              min_interval: float = 0.0) -> Schedule:
        """Validate what a user or the model wrote; raises ScheduleError."""
        zone(tz)
        if kind == "at":
            return cls("at", parse_at(text, tz, now).isoformat(), tz, now)
        if kind == "every":
            try:
                seconds = parse_duration(text)
            except ValueError as exc:
                raise ScheduleError(str(exc)) from None
            if seconds <= 0 or seconds < min_interval:
                raise ScheduleError(f"every {text!r} is too often; the shortest interval is "
                                    f"{max(min_interval, 1):g}s")
            return cls("every", f"{seconds:g}", tz, now)
        if kind == "cron":
            expr = " ".join(text.split())
            if not croniter.is_valid(expr):
                raise ScheduleError(f"{text!r} is not a cron expression; write five fields: "
                                    "minute hour day-of-month month day-of-week, e.g. "
                                    "'0 9 * * 1-5'")
            return cls("cron", expr, tz, now)
        raise ScheduleError(f"unknown schedule kind {kind!r}: at, every or cron")

    # occurrences ---------------------------------------------------------------------------

    def next_after(self, t: datetime) -> datetime | None:
        """The first run strictly after ``t``; None when there is none (a past ``at``)."""
        if self.kind == "at":
            when = datetime.fromisoformat(self.spec)
            return when if when > t else None
        if self.kind == "every":
            step = self.interval
            if t < self.anchor + step:
                return self.anchor + step
            return self.anchor + step * ((t - self.anchor) // step + 1)
        it = croniter(self.spec, t.astimezone(zone(self.tz)))
        for _ in range(_CRON_SCAN):
            candidate: datetime = it.get_next(datetime)
            if not self._repeated(candidate):
                return candidate.astimezone(UTC)
        return None

    def latest(self, t: datetime) -> datetime | None:
        """The last run at or before ``t``; None when there was none."""
        if self.kind == "at":
            when = datetime.fromisoformat(self.spec)
            return when if when <= t else None
        if self.kind == "every":
            step = self.interval
            if t < self.anchor + step:
                return None
            return self.anchor + step * ((t - self.anchor) // step)
        it = croniter(self.spec, t.astimezone(zone(self.tz)))
        prev: datetime | None = None
        for _ in range(_CRON_SCAN):
            candidate: datetime = it.get_prev(datetime)
            if not self._repeated(candidate):
                prev = candidate.astimezone(UTC)
                break
        if prev is None:
            return None
        following = self.next_after(prev)  # croniter's get_prev excludes ``t`` itself
        return following if following is not None and following <= t else prev

    @property
    def interval(self) -> timedelta:
        return timedelta(seconds=float(self.spec))

    @property
    def one_shot(self) -> bool:
        return self.kind == "at"

    def _repeated(self, when: datetime) -> bool:
        """The second pass of the repeated hour, for a job with a fixed hour."""
        if self.spec.split()[1].startswith("*"):
            return False
        local = when.astimezone(UTC).astimezone(zone(self.tz))  # croniter's fold is unreliable
        return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()

    def describe(self) -> str:
        if self.kind == "at":
            local = datetime.fromisoformat(self.spec).astimezone(zone(self.tz))
            return f"at {local:%Y-%m-%d %H:%M} {self.tz}"
        if self.kind == "every":
            return f"every {_human(float(self.spec))}"
        return f"cron '{self.spec}' {self.tz}"


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
