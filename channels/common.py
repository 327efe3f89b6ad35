"""Pieces every platform adapter needs: keeping bot tokens out of logs and error texts,
"typing…" while a turn runs, waiting for a change of state, a channel's health derived from
what completed (``Liveness``), and optional calls retried in the background (``optional``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Generic, Self, TypeVar

from gateway.kernel.backoff import Backoff
from gateway.kernel.events import ChatActivity, utcnow
from gateway.kernel.tasks import TaskSet

_log = logging.getLogger(__name__)

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


class Liveness:
    """A channel's state from what actually completed, never from a (re)start.

    ``received()`` after each completed receive (a poll that answered, a gateway event),
    ``expect_echo()`` when the platform
    should now send something back (Discord dispatches the bot's own messages). The channel is
    *degraded* once nothing was received for ``limit`` seconds since the last receive (or
    since it was first started: a restart of its transport does not count), or when an echo
    it waited for has not come within ``limit``; *down* (with the reason) when it could not
    start or was refused for good. ``limit=None``: silence is normal (a webhook), only echoes
    and ``down`` count."""

    def __init__(self, *, receive: str, limit: float | None, clock: Callable[[], float],
                 silence: bool = True) -> None:
        """``receive`` names the call or event that counts, for the reason ("getUpdates");
        ``silence=False``: a quiet platform is normal, only a missing echo counts."""
        self.receive = receive
        self.limit = limit
        self._silence = silence
        self._clock = clock
        self._since: float | None = None
        self._last_receive: float | None = None
        self._echo_due: float | None = None
        self.last_receive_at: datetime | None = None
        self.down_reason: str | None = None

    def watching(self) -> None:
        """The channel started for the first time: silence counts from now (only once)."""
        if self._since is None:
            self._since = self._clock()

    def received(self) -> None:
        self._last_receive = self._clock()
        self._echo_due = None
        self.last_receive_at = utcnow()
        self.down_reason = None

    def expect_echo(self) -> None:
        """Something should arrive soon (the platform echoes what we sent); keep the first."""
        if self._echo_due is None:
            self._echo_due = self._clock()

    def down(self, reason: str | None) -> None:
        self.down_reason = reason

    def silent_for(self) -> float | None:
        """Seconds since the last completed receive (or the first start); None before it."""
        start = self._last_receive if self._last_receive is not None else self._since
        return None if start is None else max(0.0, self._clock() - start)

    def state(self, running: bool) -> tuple[str, str | None]:
        """("connected" | "degraded" | "down", the reason or None)."""
        if self.down_reason:
            return "down", self.down_reason
        if not running:
            return "down", "not running"
        silent = self.silent_for() if self._silence else None
        if silent is not None and self.limit is not None and silent > self.limit:
            what = "since it started" if self._last_receive is None else "for"
            return "degraded", (f"no {self.receive} completed {what} {silent:.0f}s "
                                f"(watchdog {self.limit:g}s)")
        if self._echo_due is not None and self.limit is not None:
            waited = self._clock() - self._echo_due
            if waited > self.limit:
                return "degraded", (f"no {self.receive} for {waited:.0f}s after a send the "
                                    f"platform echoes (watchdog {self.limit:g}s)")
        return "connected", None

    def stalled(self) -> bool:
        """Degraded by silence or a missing echo: the transport should be rebuilt."""
        return self.state(True)[0] == "degraded"


async def optional(what: str, call: Callable[[], Awaitable[object]], *,
                   clean: Callable[[str], str] = str, label: str = "") -> None:
    """Run an optional call (a command menu, a webhook cleanup, a profile) until it works,
    with the kernel's backoff; each failure is logged under its own name. Never raises but
    ``CancelledError``: nothing that waits for it stops receiving."""
    backoff = Backoff()
    while True:
        try:
            await call()
            if backoff.attempt:
                _log.info("%s%s worked after %d failure(s)", label, what, backoff.attempt)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            delay = backoff.next()
            _log.warning("%s%s failed (%s: %s); retry in %.1fs", label, what,
                         type(exc).__name__, clean(str(exc)), delay)
            await asyncio.sleep(delay)


def read_small(path: Path, limit: int) -> bytes | int | None:
    """A file the agent sends: its bytes; its size when over ``limit``; None when it is not
    there (blocking: run it in a thread)."""
    try:
        if not path.is_file():
            return None
        size = path.stat().st_size
        return size if size > limit else path.read_bytes()
    except OSError:
        return None
