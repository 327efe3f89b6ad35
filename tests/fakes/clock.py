"""A clock that moves only when a test says so.

``advance(seconds)`` moves time and wakes every sleeper whose time has come, in deadline
order; nothing really sleeps. ``settled(n)`` waits until ``n`` loops are asleep again with a
deadline in the future, i.e. they finished what the advance made due.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware start time")
        self._now = start.astimezone(UTC)
        self._sleepers: list[tuple[datetime, asyncio.Future[None]]] = []
        self._changed = asyncio.Event()

    def now(self) -> datetime:
        return self._now

    async def sleep_until(self, when: datetime) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (when, future)
        self._sleepers.append(entry)
        self._changed.set()
        try:
            await future
        finally:
            self._sleepers.remove(entry)
            self._changed.set()

    async def sleep(self, seconds: float) -> None:
        """Until the clock is advanced ``seconds`` past now."""
        await self.sleep_until(self._now + timedelta(seconds=seconds))

    def advance(self, seconds: float = 0.0, *, to: datetime | None = None) -> None:
        self._now = to.astimezone(UTC) if to is not None else \
            self._now + timedelta(seconds=seconds)
        for when, future in sorted(self._sleepers, key=lambda e: e[0]):
            if when <= self._now and not future.done():
                future.set_result(None)

    @property
    def sleeping(self) -> int:
        """Sleepers waiting for a time still to come."""
        return sum(1 for when, f in self._sleepers if when > self._now and not f.done())

    def sleeps_until(self, when: datetime) -> bool:
        """Whether something still sleeps until ``when`` (``advance`` wakes sleepers at once:
        right after it, this says whether a sleeper was woken)."""
        return any(w == when and not f.done() for w, f in self._sleepers)

    async def sleeper_at(self, when: datetime, timeout: float = 10.0) -> None:
        """Wait until something sleeps until exactly ``when`` (a retry ``n`` seconds on: the
        one sleeper a test is about, whatever else sleeps on this clock)."""
        await self.sleeper_by(when, exactly=True, timeout=timeout)

    async def sleeper_by(self, when: datetime, *, exactly: bool = False,
                         timeout: float = 10.0) -> None:
        """Wait until something sleeps until a time after now and no later than ``when``
        (a short backoff with jitter, while the schedules sleep for longer)."""
        def found() -> bool:
            return any(not f.done() and (w == when if exactly else self._now < w <= when)
                       for w, f in self._sleepers)

        async with asyncio.timeout(timeout):
            while not found():
                self._changed.clear()
                await self._changed.wait()

    async def settled(self, n: int, timeout: float = 10.0) -> None:
        """Wait until ``n`` sleepers wait for a future time (their loops are idle again)."""
        async with asyncio.timeout(timeout):
            while self.sleeping < n:
                self._changed.clear()
                await self._changed.wait()
