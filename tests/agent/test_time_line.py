"""The runtime block's time line, formatted once a minute, reads exactly as ``strftime``
formats each instant: across minutes, days, daylight-saving changes both ways, zones a
half or three quarters of an hour off, and times given in other zones."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from agent.time_line import TimeLine


def test_the_time_line_reads_as_strftime_writes_it() -> None:
    rng = random.Random(24)
    changes = [datetime(2026, 3, 29, 1, 0, tzinfo=UTC),    # Berlin: 02:00 → 03:00
               datetime(2026, 10, 25, 1, 0, tzinfo=UTC),   # Berlin: 03:00 → 02:00 twice
               datetime(2026, 4, 5, 15, 0, tzinfo=UTC),    # Lord Howe: half an hour back
               datetime(2026, 11, 1, 3, 30, tzinfo=UTC),   # St John's: 02:00 → 01:00
               datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC),
               datetime(1890, 1, 1, 12, tzinfo=UTC),        # local mean times: odd seconds
               datetime(1893, 3, 31, 23, 6, 32, tzinfo=UTC)]  # Berlin: to CET mid-minute
    for name in ("Europe/Berlin", "Australia/Lord_Howe", "America/St_Johns",
                 "Asia/Kathmandu", "UTC", "Europe/Amsterdam"):
        tz = ZoneInfo(name)
        line = TimeLine(tz, name)
        times = [at + timedelta(seconds=rng.uniform(-7200, 7200))
                 for at in changes for _ in range(300)]
        times += [changes[-1] + timedelta(seconds=s) for s in range(-40, 40)]
        times += [t.astimezone(timezone(timedelta(hours=-3))) for t in times[::7]]
        ordered = sorted(times, key=lambda t: t.astimezone(UTC))
        rng.shuffle(times)  # forwards and back, as replays of older turns go
        for at in [*ordered, *reversed(ordered), *times]:
            assert line(at) == at.astimezone(tz).strftime(line.format), (name, at)


def test_a_percent_sign_in_the_zones_name_is_written_as_it_is() -> None:
    line = TimeLine(ZoneInfo("UTC"), "UTC%d")
    at = datetime(2026, 11, 28, 10, 5, 7, tzinfo=UTC)
    assert line(at) == "Time: 2026-11-28 10:05:07 UTC%d (UTC+0000), Saturday"
