"""The runtime block's ``Time:`` line, formatted once a minute.

``datetime.strftime`` costs ~25,000 instructions (about 0.7 % of a turn's); the line changes
in its seconds only, except when the minute turns. So the text before the seconds and after
them is formatted for a whole minute (in UTC, whatever the zone: a minute's bounds are exact
there, and no zone changes its offset inside one) and a turn only looks up its seconds. A
zone whose offset has seconds in it (the local mean times of old dates), or that changes
offset within the minute, is formatted whole, as before.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

_MINUTE = timedelta(minutes=1)
_LAST = timedelta(minutes=1, microseconds=-1)
_D2 = tuple(f"{i:02d}" for i in range(60))


class TimeLine:
    def __init__(self, tz: ZoneInfo, zone_name: str) -> None:
        self.tz = tz
        zone = zone_name.replace("%", "%%")
        self.format = f"Time: %Y-%m-%d %H:%M:%S {zone} (UTC%z), %A"
        self._head = "Time: %Y-%m-%d %H:%M:"
        self._tail = f" {zone} (UTC%z), %A"
        self._minute = (datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC),
                        "", "")
        """[start, end) of the minute formatted last, the text before its seconds and after."""

    def __call__(self, at: datetime) -> str:
        """``at.astimezone(tz).strftime(format)``; ``at`` is timezone-aware."""
        start, end, head, tail = self._minute
        if not start <= at < end:
            local = at.astimezone(self.tz)
            start = at.astimezone(UTC).replace(second=0, microsecond=0)
            offset = local.utcoffset()
            if (start.year == 9999 or offset is None or offset % _MINUTE
                    or start.astimezone(self.tz).utcoffset() != offset
                    or (start + _LAST).astimezone(self.tz).utcoffset() != offset):
                return local.strftime(self.format)
            head, tail = local.strftime(self._head), local.strftime(self._tail)
            self._minute = start, start + _MINUTE, head, tail
        return f"{head}{_D2[at.second]}{tail}"
