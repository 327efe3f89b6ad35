"""Pieces every platform adapter needs: keeping bot tokens out of logs and error texts,
"typing…" while a turn runs, and waiting for a change of state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from datetime import datetime
from typing import Generic, Self, TypeVar

from gateway.kernel.events import ChatActivity
from gateway.kernel.tasks import TaskSet

MAX_TYPING_SECONDS = 600.0
"""A turn that runs longer stops showing "typing…" (a stuck turn should not look busy forever)."""

K = TypeVar("K", bound=Hashable)


class StateWatch:
    """A mixin: ``_notify()`` after each change of state (connected, polled, message handled),
    ``wait_until(predicate)`` for ``start()`` and tests, which never sleep to find out."""

    _changed: asyncio.Condition

    async def wait_until(self, predicate: Callable[[Self], bool],
                         timeout: float = 10.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[token]")
    return text


class SecretFilter(logging.Filter):
    """Rewrites log records that contain a secret (Telegram puts the bot token in every API
    URL; discord.py logs gateway payloads)."""

    def __init__(self, *secrets: str) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True

    def cover(self, *roots: str, on: bool = True) -> None:
        """Add (``on``) or remove this filter on the loggers ``roots`` and their children known
        so far: a logger's filter applies to its own records only, not to its children's."""
        children = tuple(f"{root}." for root in roots)
        known = [n for n in logging.Logger.manager.loggerDict if n.startswith(children)]
        for name in {*roots, *known}:
            logger = logging.getLogger(name)
            (logger.addFilter if on else logger.removeFilter)(self)


def iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts else None


class Typing(Generic[K]):
    """"typing…" while a chat's turns run. Platforms show it for a few seconds per call, so
    ``show(place)`` is repeated every ``interval`` seconds while any turn there is busy (for
    at most ``MAX_TYPING_SECONDS``). ``show`` may return how long the platform asked us to
    wait before the next call; its failures are its own to log."""

    def __init__(self, name: str, tasks: TaskSet, *, place: Callable[[ChatActivity], K],
                 show: Callable[[K], Awaitable[float | None]], interval: float,
                 clock: Callable[[], float]) -> None:
        self.name = name
        self.running: dict[K, asyncio.Task[None]] = {}
        self._busy: dict[K, int] = {}
        self._tasks = tasks
        self._place = place
        self._show = show
        self._interval = interval
        self._clock = clock

    def activity(self, event: ChatActivity) -> None:
        key = self._place(event)
        count = self._busy.get(key, 0) + (1 if event.busy else -1)
        if count > 0:
            self._busy[key] = count
            if key not in self.running:
                self.running[key] = self._tasks.spawn(self._keep_typing(key),
                                                      f"{self.name}-typing:{event.chat_id}")
            return
        self._busy.pop(key, None)
        task = self.running.pop(key, None)
        if task is not None:
            task.cancel()

    def clear(self) -> None:
        """Forget every place (after the tasks were cancelled with their ``TaskSet``)."""
        self.running.clear()
        self._busy.clear()

    async def _keep_typing(self, key: K) -> None:
        deadline = self._clock() + MAX_TYPING_SECONDS
        try:
            while self._clock() < deadline:
                told = await self._show(key)
                await asyncio.sleep(self._interval if told is None else told)
        finally:
            if self.running.get(key) is asyncio.current_task():
                del self.running[key]
