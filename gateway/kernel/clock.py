"""The clock schedules run on: injected, so tests move time instead of waiting for it.

``Clock.now()`` is timezone-aware UTC. ``sleep_until`` may return early (the system clock
naps at most a minute at a time) or late; a caller always looks at ``now()`` again. The fake
for tests is ``tests/fakes/clock.py``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol

MAX_NAP = 60.0
"""The system clock sleeps at most this long at a time: the wall clock can jump (a suspended
laptop, an NTP step) while the event loop's monotonic clock does not."""


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep_until(self, when: datetime) -> None: ...

    async def sleep(self, seconds: float) -> None:
        """A pause of ``seconds`` (a retry's wait): the event loop's monotonic time on the
        system clock, so a step of the wall clock neither stretches nor skips it."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        delay = (when - self.now()).total_seconds()
        if delay > 0:  # callers loop and look at now() again
            await asyncio.sleep(min(delay, MAX_NAP))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def sleep_or_wake(clock: Clock, when: datetime, wake: asyncio.Event) -> None:
    """Sleep until ``when`` or until ``wake`` is set, whichever comes first."""
    if wake.is_set():
        return
    sleeper = asyncio.create_task(clock.sleep_until(when), name="clock-sleep")
    waker = asyncio.create_task(wake.wait(), name="clock-wake")
    try:
        await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, waker):
            task.cancel()
        await asyncio.gather(sleeper, waker, return_exceptions=True)
