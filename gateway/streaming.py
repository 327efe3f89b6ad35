"""StreamDesk: shows replies while they are written, and hands the outbox what it showed.

A turn opens a ``ReplyStream`` through the bus (``MessageBus.open_stream``); when the chat's
channel has ``streaming`` on and shows replies live (``Channel.live``), the desk follows the
stream in a task of its own: the text so far (a code fence left open closed,
``interim_markdown``), or the status line while tools run, goes to ``LiveReplies.show`` at
most every ``interval`` seconds and only after it grew by ``min_chars``; a 429's
``retry_after`` is waited out. Time is the gateway's ``Clock``, so tests move it.

One owner of the final message: the stream never sends the answer. The platform message a
stream created is written to the ``reply_streams`` table as soon as it exists; the turn's
reply (``OutboundMessage.stream``) goes through the outbox, and its delivery
(``ChannelManager``) asks ``settle(key)`` for that message: the channel edits its first part
into it (``LiveReplies.finish``), exactly once, and the row is forgotten after. After a
``kill -9`` the row is still there: the turn answered again after the restart (or its stored
reply) finishes the same message instead of leaving a second copy beside it.

The one window left: a process killed between the platform creating the first message and
that row's commit (a few milliseconds). On Discord the restart's first update carries the same
nonce, so Discord returns that message instead of a second; Telegram has no such check, and
would then show the answer in a new message beside the half one. Drafts (Telegram's private
chats) leave nothing behind to begin with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial

from channels.base import Channel, LiveReplies
from gateway.kernel.clock import Clock, SystemClock, sleep_or_wake
from gateway.kernel.config import Config, StreamingConfig
from gateway.kernel.events import OutboundMessage
from gateway.kernel.store import Store
from gateway.kernel.store_sql import Migration, TableSet, register
from gateway.kernel.streams import ReplyStream, interim_markdown

_log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reply_streams (
    key TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""
_SCHEMA_PG = _SCHEMA.replace("REAL", "DOUBLE PRECISION")
"""PostgreSQL's twin: the same table, times DOUBLE PRECISION."""
TABLES = register(TableSet("streams", (Migration(1, _SCHEMA, _SCHEMA_PG),), ("reply_streams",),
                           upsert_keys={"reply_streams": ("key",)}))
FIRST_SHOWN_KEPT = 1000
KEEP_SECONDS = 7 * 24 * 3600.0
"""A recorded message whose reply never came for this long is forgotten at the next start."""


class StreamDesk:
    def __init__(self, channels: dict[str, Channel],
                 settings: Callable[[str], StreamingConfig | None]) -> None:
        self._channels = channels
        self.settings = settings
        """A channel's ``streaming`` section (None: it streams nothing)."""
        self.clock: Clock = SystemClock()
        self.store: Store | None = None
        self._ids: dict[str, str] = {}
        """Stream key → the platform message showing it (what the table holds)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loaded = asyncio.Event()
        """Set once the recorded messages are read: a turn answered again at the start
        (before the outbox runs) must find the message its first run showed."""
        self.first_shown_ms: list[float] = []
        """From the model's first text to the channel's first answer showing it (bench)."""

    async def start(self, store: Store | None) -> None:
        self.store = store
        if store is not None:
            await store.migrate(TABLES)
            async with store.transaction() as db:
                await db.execute("DELETE FROM reply_streams WHERE updated_at < ?",
                                 (time.time() - KEEP_SECONDS,))
            for key, message_id in await store.fetchall(
                    "SELECT key, message_id FROM reply_streams"):
                self._ids[str(key)] = str(message_id)
        self._loaded.set()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def live(self, channel: str) -> tuple[LiveReplies, StreamingConfig] | None:
        found = self._channels.get(channel)
        settings = self.settings(channel)
        live = getattr(found, "live", None)  # a channel without ChannelBase may lack it
        if live is None or settings is None or not settings.enabled:
            return None
        return live, settings

    def open(self, target: OutboundMessage) -> ReplyStream | None:
        """The bus's opener: a stream followed for ``target``'s channel, or None."""
        live = self.live(target.channel)
        if live is None or target.stream is None:
            return None
        stream = ReplyStream(target)
        old = self._tasks.pop(stream.key, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(self._follow(stream, *live), name=f"stream:{stream.key}")
        self._tasks[stream.key] = task
        task.add_done_callback(partial(self._done, stream.key))
        return stream

    def _done(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled() and task.exception() is not None:
            _log.error("reply stream %s failed: %s", key, task.exception())

    async def settle(self, key: str) -> str | None:
        """Wait until the stream of ``key`` stopped showing; the message it showed in, if
        any (also one made before a restart)."""
        task = self._tasks.get(key)
        if task is not None:
            await asyncio.wait({task})
        return self._ids.get(key)

    def quiet(self, key: str) -> bool:
        """Nothing shows the stream of ``key`` nor is showing it: its final needs no settling."""
        return key not in self._tasks and key not in self._ids

    async def forget(self, key: str) -> None:
        """The final is delivered: the stream's message is the answer now."""
        if self._ids.pop(key, None) is not None and self.store is not None:
            async with self.store.transaction() as db:
                await db.execute("DELETE FROM reply_streams WHERE key = ?", (key,))

    async def _remember(self, stream: ReplyStream, message_id: str) -> None:
        self._ids[stream.key] = message_id
        if self.store is not None:
            target = stream.target
            async with self.store.transaction() as db:
                await db.execute(
                    "INSERT OR REPLACE INTO reply_streams (key, channel, chat_id, message_id, "
                    "updated_at) VALUES (?, ?, ?, ?, ?)",
                    (stream.key, target.channel, target.chat_id, message_id, time.time()))

    async def _follow(self, stream: ReplyStream, live: LiveReplies,
                      settings: StreamingConfig) -> None:
        closed = asyncio.Event()
        stream.listen(lambda s: closed.set() if s.closed else None)
        await self._loaded.wait()
        interval = timedelta(seconds=settings.interval)
        shown = ""
        last_at = None
        seen = 0
        retry = False
        while True:
            if not retry:
                await stream.wait(seen)
            retry = False
            seen = stream.revision
            if stream.closed:
                break
            view = _view(stream, settings)
            if not view or view == shown:
                continue
            if shown and stream.text and len(view) - len(shown) < settings.min_chars:
                continue
            if last_at is not None and self.clock.now() < last_at + interval:
                await sleep_or_wake(self.clock, last_at + interval, closed)
                if stream.closed:
                    break
                seen = stream.revision
                view = _view(stream, settings) or view
            result = await live.show(stream.target, view, self._ids.get(stream.key))
            last_at = self.clock.now()
            if result.retry_after is not None:
                _log.info("stream %s: rate limited, waiting %.1fs", stream.key,
                          result.retry_after)
                await sleep_or_wake(self.clock,
                                    last_at + timedelta(seconds=result.retry_after), closed)
                retry = True
                continue
            if result.error is not None:
                _log.warning("stream %s: %s", stream.key, result.error)
                continue
            if not shown and stream.first_text_at is not None and stream.text:
                self._first_shown(stream.first_text_at)
            shown = view
            if result.message_id is not None and \
                    result.message_id != self._ids.get(stream.key):
                await self._remember(stream, result.message_id)
        if stream.outcome == "none" and (message_id := self._ids.get(stream.key)):
            await live.remove(stream.target, message_id)
            await self.forget(stream.key)

    def _first_shown(self, first_text_at: float) -> None:
        self.first_shown_ms.append((time.perf_counter() - first_text_at) * 1000)
        del self.first_shown_ms[:-FIRST_SHOWN_KEPT]


def channel_streaming(config: Config, channel: str) -> StreamingConfig | None:
    """``channels.<channel>.streaming`` of ``config``, if the channel has one."""
    return getattr(getattr(config.channels, channel, None), "streaming", None)


def _view(stream: ReplyStream, settings: StreamingConfig) -> str:
    text = stream.text
    if text.strip():
        return interim_markdown(text)
    return f"_{stream.status}…_" if settings.status and stream.status else ""
