"""ChannelManager: takes outbound messages off the bus and hands them to their channel.

One worker per channel, so a slow or failing channel never delays another; messages of one
channel go out in order. A failed send is retried with jittered backoff (honouring a
channel's ``retry_after``) before it is given up and logged.
"""

from __future__ import annotations

import asyncio
import logging
import random

from channels.base import Channel, ChannelHints, Delivery
from gateway.bus import MessageBus
from gateway.events import ChatActivity, OutboundMessage

_log = logging.getLogger(__name__)


class ChannelManager:
    def __init__(self, bus: MessageBus, *, max_attempts: int = 4,
                 backoff: float = 0.5) -> None:
        self.bus = bus
        self.channels: dict[str, Channel] = {}
        self.max_attempts = max_attempts
        self.backoff = backoff
        self._queues: dict[str, asyncio.Queue[OutboundMessage]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.delivered = 0
        self.failed = 0
        bus.on_activity(self._activity)

    def _activity(self, event: ChatActivity) -> None:
        """Forward to the channel's optional ``activity(event)`` (typing indicators)."""
        channel = self.channels.get(event.channel)
        hook = getattr(channel, "activity", None)
        if hook is not None:
            hook(event)

    def add(self, channel: Channel) -> None:
        self.channels[channel.name] = channel

    def hints(self, name: str) -> ChannelHints:
        channel = self.channels.get(name)
        return channel.hints if channel else ChannelHints()

    async def start_channels(self) -> None:
        started: list[Channel] = []
        try:
            for channel in self.channels.values():
                await channel.start()
                started.append(channel)
        except BaseException:
            for channel in reversed(started):
                await channel.stop()
            raise

    async def stop_channels(self) -> None:
        for name, channel in reversed(list(self.channels.items())):
            try:
                await channel.stop()
            except Exception:
                _log.exception("channel %s did not stop cleanly", name)

    def start(self) -> None:
        self._spawn(self._route(), "delivery-router")
        for name in self.channels:
            self._queues[name] = asyncio.Queue()
            self._spawn(self._worker(name), f"delivery:{name}")

    def _spawn(self, coro: object, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self, within: float = 5.0) -> bool:
        """Wait until everything queued so far was handed to its channel."""
        async def drained() -> None:
            await self.bus.join_outbound()
            await asyncio.gather(*(q.join() for q in self._queues.values()))
        try:
            await asyncio.wait_for(drained(), within)
            return True
        except TimeoutError:
            return False

    async def stop(self, within: float = 5.0) -> None:
        if not self._tasks:
            return
        if not await self.flush(within):
            _log.warning("stopping with undelivered messages")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _route(self) -> None:
        while True:
            msg = await self.bus.consume_outbound()
            queue = self._queues.get(msg.channel)
            if queue is None:
                _log.error("no channel %r for a %s message to chat %s; dropped", msg.channel,
                           msg.kind, msg.chat_id)
                self.failed += 1
            elif msg.kind != "progress" or getattr(self.channels[msg.channel],
                                                   "wants_progress", False):
                queue.put_nowait(msg)  # tool progress goes only to channels that show it
            self.bus.outbound_done()

    async def _worker(self, name: str) -> None:
        queue = self._queues[name]
        channel = self.channels[name]
        while True:
            msg = await queue.get()
            try:
                await self._deliver(channel, msg)
            finally:
                queue.task_done()

    async def _deliver(self, channel: Channel, msg: OutboundMessage) -> Delivery:
        delivery = Delivery(ok=False, error="not sent")
        for attempt in range(1, self.max_attempts + 1):
            try:
                delivery = await channel.send(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.exception("channel %s raised while sending", channel.name)
                delivery = Delivery(ok=False, error=f"{type(exc).__name__}: {exc}")
            if delivery.ok:
                self.delivered += 1
                return delivery
            if delivery.permanent or attempt == self.max_attempts:
                break
            delay = delivery.retry_after if delivery.retry_after is not None else \
                self.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
            _log.warning("channel %s: send to %s failed (%s); retry in %.1fs", channel.name,
                         msg.chat_id, delivery.error, delay)
            await asyncio.sleep(delay)
        self.failed += 1
        _log.error("channel %s: gave up sending to chat %s: %s", channel.name, msg.chat_id,
                   delivery.error)
        return delivery
