"""The message bus: two bounded asyncio queues between channels and the agent.

Bounded on purpose: a channel that produces faster than the agent consumes waits in
``publish_inbound`` (back-pressure) instead of growing memory without limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.events import ChatActivity, InboundMessage, OutboundMessage

_log = logging.getLogger(__name__)


class BusClosed(Exception):
    """Raised to a publisher once the bus stopped taking input."""


class MessageBus:
    def __init__(self, maxsize: int = 1000) -> None:
        self._inbound: asyncio.Queue[InboundMessage] = asyncio.Queue(maxsize)
        self._outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue(maxsize)
        self._closed = False
        self._activity: list[Callable[[ChatActivity], None]] = []

    def on_activity(self, listener: Callable[[ChatActivity], None]) -> None:
        self._activity.append(listener)

    def activity(self, event: ChatActivity) -> None:
        """Tell listeners (the channels' typing indicators) a chat's turn started or ended."""
        for listener in self._activity:
            try:
                listener(event)
            except Exception:
                _log.exception("activity listener failed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop taking inbound messages; what is queued can still be consumed."""
        self._closed = True

    async def publish_inbound(self, msg: InboundMessage) -> None:
        if self._closed:
            raise BusClosed("the gateway is shutting down")
        await self._inbound.put(msg)

    async def consume_inbound(self) -> InboundMessage:
        return await self._inbound.get()

    def drain_inbound(self) -> list[InboundMessage]:
        """Everything queued inbound right now, without waiting (used while stopping)."""
        out = []
        while not self._inbound.empty():
            out.append(self._inbound.get_nowait())
        return out

    async def publish_outbound(self, msg: OutboundMessage) -> None:
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
