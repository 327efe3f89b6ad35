"""The message bus: two bounded asyncio queues between channels and the agent.

Bounded on purpose: a channel that produces faster than the agent consumes waits in
``publish_inbound`` (back-pressure) instead of growing memory without limit. With a store
attached the bus is durable: an inbound message is in the inbox before ``publish_inbound``
returns (so a channel acknowledges it to its platform only once it is safe; ``NotStored`` when it
could not be, and then nothing is queued), a repeated channel message is ignored, and an
outbound message is in the outbox before it is queued for sending.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from gateway.kernel.events import (
    ChatActivity,
    InboundMessage,
    MessageStage,
    OutboundMessage,
    utcnow,
)
from gateway.kernel.streams import ReplyStream
from gateway.kernel.values import TurnSend

if TYPE_CHECKING:
    from gateway.kernel.store import Store

_log = logging.getLogger(__name__)


E = TypeVar("E")


def _tell(listeners: list[Callable[[E], None]], event: E, what: str) -> None:
    """Each listener hears ``event``; one that raises is logged and the others still hear."""
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            _log.exception("%s listener failed", what)


class BusClosed(Exception):
    """Raised to a publisher once the bus stopped taking input."""


class NotStored(Exception):
    """Raised to a publisher when the inbox could not store its message (the database file is
    gone, read-only, the disk full): nothing was queued, and the channel must not acknowledge
    the message to its platform, which keeps it (or its sender retries)."""


class MessageBus:
    def __init__(self, maxsize: int = 1000) -> None:
        self._inbound: asyncio.Queue[InboundMessage] = asyncio.Queue(maxsize)
        self._outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue(maxsize)
        self._closed = False
        self._activity: list[Callable[[ChatActivity], None]] = []
        self._stream_opener: Callable[[OutboundMessage], ReplyStream | None] | None = None
        self._stream_watchers: dict[str, Callable[[ReplyStream], None]] = {}
        self._stages: list[Callable[[MessageStage], None]] = []
        self._with_turn: Callable[[OutboundMessage], TurnSend | None] | None = None
        self._store: Store | None = None
        self._ttl: Callable[[str], float] = lambda kind: 600.0
        self.last_inbound: dict[str, datetime] = {}
        self.duplicates = 0

    def attach_store(self, store: Store, ttl: Callable[[str], float]) -> None:
        """Make the bus durable; ``ttl(kind)`` is how long an outbound message may wait."""
        self._store = store
        self._ttl = ttl

    def expires_at(self, msg: OutboundMessage) -> datetime:
        return msg.created_at + timedelta(seconds=self._ttl(msg.kind))

    def on_activity(self, listener: Callable[[ChatActivity], None]) -> None:
        self._activity.append(listener)

    def activity(self, event: ChatActivity) -> None:
        """Tell listeners (the channels' typing indicators) a chat's turn started or ended."""
        _tell(self._activity, event, "activity")

    def on_stage(self, listener: Callable[[MessageStage], None]) -> None:
        self._stages.append(listener)

    def stage(self, event: MessageStage) -> None:
        """Tell listeners (the channels' reactions) where a person's message is."""
        _tell(self._stages, event, "stage")

    def on_stream(self, opener: Callable[[OutboundMessage], ReplyStream | None]) -> None:
        """Who shows replies while they are written (the root's ``StreamDesk``)."""
        self._stream_opener = opener

    def open_stream(self, target: OutboundMessage) -> ReplyStream | None:
        """A live view of the reply to ``target`` (its chat and ``stream`` key), or None
        when its channel shows nothing live: the turn then streams nothing at all."""
        opener = self._stream_opener
        stream = opener(target) if opener is not None else None
        watcher = self._stream_watchers.pop(target.stream, None) if target.stream else None
        if watcher is not None:
            if stream is None:  # shown nowhere else: a stream for the watcher alone
                stream = ReplyStream(target)
            try:
                watcher(stream)
            except Exception:
                _log.exception("reply stream watcher failed")
        return stream

    def watch_stream(self, key: str, watcher: Callable[[ReplyStream], None]) -> None:
        """Be handed the stream of ``key`` (``streams.stream_key``) when its turn opens it,
        once — made for the watcher alone when the channel shows nothing live (the
        OpenAI-compatible endpoint relays its text this way). A turn that opens no stream (a
        command, a refused message) never calls ``watcher``: ``unwatch_stream`` after."""
        self._stream_watchers[key] = watcher

    def unwatch_stream(self, key: str) -> None:
        self._stream_watchers.pop(key, None)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop taking inbound messages; what is queued can still be consumed."""
        self._closed = True

    async def publish_inbound(self, msg: InboundMessage) -> bool:
        """Store and queue ``msg``; False (and nothing queued) for a duplicate."""
        if self._closed:
            raise BusClosed("the gateway is shutting down")
        stored, here = (True, True) if self._store is None else await self._stored(msg)
        if not stored:
            self.duplicates += 1
            _log.info("ignored a repeat of %s message %s in chat %s", msg.channel,
                      msg.message_id, msg.chat_id)
            return False
        if here:  # not: stored, and the process holding its chat claims it (gateway/cluster.py)
            await self.enqueue_claimed(msg)
        return True

    async def enqueue_claimed(self, msg: InboundMessage) -> None:
        """Queue a stored message for the agent (on PostgreSQL: one this process claimed)."""
        self.last_inbound[msg.channel] = utcnow()
        await self._inbound.put(msg)

    async def _stored(self, msg: InboundMessage) -> tuple[bool, bool]:
        assert self._store is not None
        try:
            return await self._store.inbox_take(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise NotStored(f"the message could not be stored: {exc}") from exc

    async def consume_inbound(self) -> InboundMessage:
        return await self._inbound.get()

    def drain_inbound(self) -> list[InboundMessage]:
        """Everything queued inbound right now, without waiting (used while stopping)."""
        out = []
        while not self._inbound.empty():
            out.append(self._inbound.get_nowait())
        return out

    def on_send_with_turn(self, offer: Callable[[OutboundMessage], TurnSend | None]) -> None:
        """Who may send a reply in its turn's own write (the root's ``ChannelManager``)."""
        self._with_turn = offer

    def send_with_turn(self, msg: OutboundMessage) -> TurnSend | None:
        """A turn's reply sent in the turn's own write (``TurnSend``: the turn passes it to
        ``save_turn`` and settles it after), or None: store it and ``publish_outbound`` it."""
        offer = self._with_turn
        return offer(msg) if offer is not None else None

    async def publish_outbound(self, msg: OutboundMessage, *, stored: bool = False) -> None:
        """Queue ``msg`` for delivery, first writing it to the outbox unless ``stored``
        (a turn writes its reply in its own transaction). Progress lines are not kept."""
        if self._store is not None and not stored and msg.kind != "progress":
            await self._store.outbox_add(msg, self.expires_at(msg))
        await self._outbound.put(msg)

    async def consume_outbound(self) -> OutboundMessage:
        """Take the next outbound message; call ``outbound_done()`` once it is routed."""
        return await self._outbound.get()

    def outbound_done(self) -> None:
        self._outbound.task_done()

    async def join_outbound(self) -> None:
        """Wait until every outbound message published so far was routed."""
        await self._outbound.join()

    @property
    def inbound_size(self) -> int:
        return self._inbound.qsize()

    @property
    def outbound_size(self) -> int:
        return self._outbound.qsize()
