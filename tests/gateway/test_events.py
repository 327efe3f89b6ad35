"""The kernel's event helpers: ``isoformat`` writes what ``datetime.isoformat`` writes."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from gateway.kernel.events import isoformat


def test_isoformat_matches_datetime_isoformat_for_every_kind_of_time() -> None:
    rng = random.Random(24)
    base = datetime(2026, 11, 28, 23, 59, 58, tzinfo=UTC)
    times = [base + timedelta(microseconds=rng.randrange(0, 3_000_000)) for _ in range(2_000)]
    times += [base, base.replace(microsecond=999_999), base + timedelta(seconds=2),
              datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
              datetime(2026, 1, 1, tzinfo=UTC),
              datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)]
    rng.shuffle(times)  # back and forth across second, minute, day and year boundaries
    for ts in times:
        assert isoformat(ts) == ts.isoformat()
    for other in (base.replace(tzinfo=None), base.astimezone(timezone(timedelta(hours=5))),
                  base.astimezone(ZoneInfo("Europe/Berlin"))):
        assert isoformat(other) == other.isoformat()
