"""ChannelManager: takes outbound messages off the bus and hands them to their channel.

Every message (but progress lines) is in the outbox before it gets here. Each chat has its own
ordered worker, so a slow or failing chat never delays another chat, let alone another
channel. A failed send is retried with jittered exponential backoff (a channel's
``retry_after`` wins) until it is delivered, refused for good, or out of time; then it is
dead-lettered. On start, undelivered messages from the last run are sent first; a delivered
one is never sent again. ``deliver_now`` (the message tool) takes the same path with a short
deadline and a few tries, and returns what happened.

A send whose outcome is unknown (``Delivery.unknown``: the request went out, no readable answer
came back) is resent at most once, and the log and the outbox say so; a second unknown outcome
is dead-lettered as "may have been delivered" rather than risk a third copy. Channels that can
check first (Discord's nonce) never report unknown: their resends are safe.

A channel that cannot start (a refused token, a malformed answer, the platform unreachable) is
marked down with a one-line reason (``down``) and started again in the background with the
kernel's backoff; the gateway and its other channels keep running.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from channels.base import Channel
from gateway.kernel.backoff import Backoff, BackoffPolicy
from gateway.kernel.bus import MessageBus
from gateway.kernel.clock import Clock, SystemClock
from gateway.kernel.config import DeliveryConfig
from gateway.kernel.events import ChatActivity, MessageStage, OutboundMessage, utcnow
from gateway.kernel.store import PendingOutbound, Store
from gateway.kernel.tasks import TaskSet
from gateway.kernel.values import ChannelHints, Delivery, OutboxMark, TurnSend
from gateway.streaming import StreamDesk

_log = logging.getLogger(__name__)

RECENT_ERRORS = 10
RESTART_POLICY = BackoffPolicy(base=1.0, cap=60.0)
"""How often a channel that could not start is tried again."""


@dataclass(slots=True)
class ChannelStats:
    sent: int = 0
    failed_tries: int = 0
    dead: int = 0
    last_send_ok: datetime | None = None
    recent_errors: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_ERRORS))


@dataclass(slots=True)
class _Job:
    msg: OutboundMessage
    attempts: int = 0
    expires_at: datetime | None = None
    """No try starts after this (the reply's TTL, or ``deliver_now``'s deadline)."""
    durable: bool = True
    """In the outbox: every result recorded, retried, dead-lettered. Progress lines are not."""
    max_attempts: int | None = None
    within: float | None = None
    """``deliver_now``'s caller waits this long at most: a send may not run past
    ``expires_at`` either."""
    unknown: int = 0
    """Sends whose outcome was unknown so far (the message is resent after the first only)."""

    def exhausted(self, delay: float) -> bool:
        """Out of tries, or would the next one, ``delay`` seconds from now, come too late?"""
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            return True
        return self.expires_at is not None and \
            utcnow() + timedelta(seconds=delay) >= self.expires_at

    def time_left(self) -> float | None:
        if self.within is None or self.expires_at is None:
            return None
        return max(0.0, (self.expires_at - utcnow()).total_seconds())


class ChannelManager:
    def __init__(self, bus: MessageBus, config: DeliveryConfig | None = None) -> None:
        self.bus = bus
        self.config = config or DeliveryConfig()
        self.store: Store | None = None
        self.clock: Clock = SystemClock()
        """What a retry waits on (the gateway's: a test's fake clock moves it)."""
        self.channels: dict[str, Channel] = {}
        self.stats: dict[str, ChannelStats] = {}
        self._chats: dict[tuple[str, str], deque[_Job]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._router: asyncio.Task[None] | None = None
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.down: dict[str, str] = {}
        """Channels that could not start, with the reason; they are tried again meanwhile."""
        self._restarts = TaskSet()
        bus.on_activity(self._activity)
        self.streams = StreamDesk(self.channels, lambda name: None)
        """Replies shown while written; the root sets which channels (``settings``)."""
        bus.on_stream(self.streams.open)
        bus.on_stage(self._stage)
        bus.on_send_with_turn(self.send_with_turn)

    # channels ------------------------------------------------------------------------------

    def add(self, channel: Channel) -> None:
        self.channels[channel.name] = channel
        self.stats[channel.name] = ChannelStats()

    def hints(self, name: str) -> ChannelHints:
        channel = self.channels.get(name)
        return channel.hints if channel else ChannelHints()

    def _activity(self, event: ChatActivity) -> None:
        """Forward to the chat's channel (typing indicators)."""
        channel = self.channels.get(event.channel)
        if channel is not None:
            channel.activity(event)

    def _stage(self, event: MessageStage) -> None:
        """Forward to the message's channel when it shows reactions (``streaming``)."""
        channel = self.channels.get(event.channel)
        settings = self.streams.settings(event.channel)
        if channel is not None and settings is not None and settings.reactions:
            react = getattr(channel, "react", None)
            if react is not None:
                react(event)

    async def start_channels(self) -> None:
        """Start each channel; one that cannot start is marked down and retried in the
        background, and the others start all the same."""
        for name, channel in self.channels.items():
            if not await self._start_one(name, channel):
                self._restarts.spawn(self._keep_starting(name, channel), f"channel-start:{name}")

    async def _start_one(self, name: str, channel: Channel) -> bool:
        try:
            await channel.start()
        except Exception as exc:
            reason = one_line(exc)
            first = name not in self.down
            self.down[name] = reason
            _log.log(logging.ERROR if first else logging.WARNING,
                     "channel %s could not start: %s", name, reason)
            try:
                await channel.stop()  # release what the failed start took
            except Exception as stop_exc:
                _log.warning("channel %s: cleaning up after the failed start: %s", name,
                             one_line(stop_exc))
            return False
        if self.down.pop(name, None) is not None:
            _log.info("channel %s started after all", name)
        return True

    async def _keep_starting(self, name: str, channel: Channel) -> None:
        backoff = Backoff(RESTART_POLICY)
        while True:
            await asyncio.sleep(backoff.next())
            if self.bus.closed:
                return
            if await self._start_one(name, channel):
                return

    async def stop_channels(self) -> None:
        await self._restarts.cancel_all()
        for name, channel in reversed(list(self.channels.items())):
            try:
                await channel.stop()
            except Exception:
                _log.exception("channel %s did not stop cleanly", name)

    # lifecycle -----------------------------------------------------------------------------

    async def start(self, store: Store | None = None, *, resend: bool = True) -> None:
        """Resend what the last run left undelivered (unless ``resend`` is False: on
        PostgreSQL the cluster worker claims it), then route new messages."""
        self.store = store
        await self.streams.start(store)
        if store is not None and resend:
            await self.resend(await store.outbox_pending(list(self.channels)))
        self._router = asyncio.create_task(self._route(), name="delivery-router")

    async def resend(self, pending: list[PendingOutbound]) -> None:
        """Deliver stored replies (left by the last run, or by a process that died)."""
        now = utcnow()
        for item in pending:
            job = _Job(item.message, item.attempts, item.expires_at)
            if item.expires_at <= now:
                await self._dead(job, "expired before the gateway could send it")
            else:
                self._enqueue(job)

    async def flush(self, within: float = 5.0) -> bool:
        """Wait until everything queued so far was delivered or given up."""
        async def drained() -> None:
            await self.bus.join_outbound()
            await self._idle.wait()
        try:
            await asyncio.wait_for(drained(), within)
            return True
        except TimeoutError:
            return False

    async def stop(self, within: float = 5.0) -> None:
        if self._router is None:
            return
        if not await self.flush(within):
            _log.warning("stopping with %d undelivered message(s); they stay in the outbox "
                         "and are sent after the next start", self._inflight)
        tasks = [self._router, *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.streams.stop()
        self._router = None
        self._tasks.clear()
        self._chats.clear()

    def pending(self, channel: str | None = None) -> int:
        return sum(len(q) for (name, _), q in self._chats.items()
                   if channel is None or name == channel)

    # routing -------------------------------------------------------------------------------

    async def _route(self) -> None:
        while True:
            msg = await self.bus.consume_outbound()
            try:
                channel = self.channels.get(msg.channel)
                if channel is None:
                    await self._dead(_Job(msg, durable=msg.kind != "progress"),
                                     f"no channel {msg.channel!r} is running")
                elif msg.kind != "progress":
                    self._enqueue(_Job(msg, expires_at=self.bus.expires_at(msg)))
                elif channel.wants_progress:
                    self._enqueue(_Job(msg, durable=False))  # shown live, never retried
            finally:
                self.bus.outbound_done()

    def _enqueue(self, job: _Job) -> None:
        key = (job.msg.channel, job.msg.chat_id)
        queue = self._chats.get(key)
        self._inflight += 1
        self._idle.clear()
        if queue is not None:
            queue.append(job)
            return
        self._chats[key] = deque([job])
        task = asyncio.create_task(self._chat_worker(key), name=f"delivery:{key[0]}:{key[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _chat_worker(self, key: tuple[str, str]) -> None:
        """Send one chat's messages in order; the worker ends when the chat has none left."""
        queue = self._chats[key]
        try:
            while queue:
                job = queue[0]
                try:
                    await self._deliver(job)
                except Exception:
                    _log.exception("delivery to %s:%s failed unexpectedly", *key)
                queue.popleft()
                self._done()
        finally:
            if self._chats.get(key) is queue and not queue:
                del self._chats[key]

    def _done(self) -> None:
        self._inflight -= 1
        if self._inflight <= 0:
            self._inflight = 0
            self._idle.set()

    # one message ---------------------------------------------------------------------------

    def send_with_turn(self, msg: OutboundMessage) -> TurnSend | None:
        """``msg`` sent in the write of the turn that made it (``TurnSend``), when its channel
        offers that (``send_with_turn``: its sending is a write to our database) and nothing
        is ahead of it in its chat: no message of the chat queued or being sent here, none
        published and not routed yet, no live reply of its to settle. None: the usual path."""
        if self.store is None or msg.kind == "progress" or self.bus.outbound_size:
            return None
        channel = self.channels.get(msg.channel)
        offer = getattr(channel, "send_with_turn", None)
        if (channel is None or offer is None or channel.name in self.down
                or (msg.channel, msg.chat_id) in self._chats
                or (msg.stream is not None and not self.streams.quiet(msg.stream))):
            return None
        send: TurnSend | None = offer(msg)
        if send is not None:
            stats, settle = self.stats[channel.name], send.settle

            def counted(result: object) -> Delivery:
                delivery = settle(result)
                stats.sent += 1
                stats.last_send_ok = utcnow()
                return delivery

            send.settle = counted
        return send

    async def deliver_now(self, msg: OutboundMessage, *, attempts: int = 3,
                          within: float = 15.0) -> Delivery:
        """Send ``msg`` at once and return what happened, for a caller that must report it
        (the message tool). Stored in the outbox first; a few quick tries within ``within``
        seconds, then dead-lettered, so it is never sent later behind the caller's back."""
        if self.store is not None:
            await self.store.outbox_add(msg, self.bus.expires_at(msg))
        return await self._deliver(_Job(msg, expires_at=utcnow() + timedelta(seconds=within),
                                        max_attempts=attempts, within=within))

    async def _deliver(self, job: _Job) -> Delivery:
        """The one path every message takes: send, count, record, back off, retry or give up."""
        channel = self.channels.get(job.msg.channel)
        if channel is None:
            error = f"no channel {job.msg.channel!r} is running"
            await self._dead(job, error)
            return Delivery(ok=False, error=error, permanent=True)
        stats = self.stats[channel.name]
        while True:
            job.attempts += 1
            delivery = await self._try(channel, job)
            if delivery.ok:
                stats.sent += 1
                stats.last_send_ok = utcnow()
                if job.durable and self.store is not None and not delivery.recorded:
                    await self.store.outbox_result(job.msg.idempotency_key, delivered=True,
                                                   attempts=job.attempts)
                if job.msg.stream is not None:
                    await self.streams.forget(job.msg.stream)
                return delivery
            stats.failed_tries += 1
            error = delivery.error or "failed"
            stats.recent_errors.append(f"{utcnow():%H:%M:%S} {job.msg.chat_id}: {error}")
            if not job.durable:
                return delivery
            delay = self._backoff(job.attempts, delivery.retry_after)
            if delivery.unknown:
                job.unknown += 1
                if job.unknown > 1:
                    error = f"outcome unknown twice, not sent again (it may have arrived): {error}"
                    await self._dead(job, error)
                    return delivery
            if delivery.permanent or job.exhausted(delay):
                await self._dead(job, error)
                return delivery
            if delivery.unknown:
                _log.warning("channel %s: the send to %s may have arrived (%s); resending it "
                             "once only", channel.name, job.msg.chat_id, error)
                error = f"outcome unknown, resent once: {error}"
            if self.store is not None:
                await self.store.outbox_result(job.msg.idempotency_key, delivered=False,
                                               attempts=job.attempts, error=error)
            _log.warning("channel %s: send to %s failed (%s); retry %d in %.1fs",
                         channel.name, job.msg.chat_id, error, job.attempts, delay)
            await self.clock.sleep(delay)  # the gateway's clock: tests move a fake one

    async def _try(self, channel: Channel, job: _Job) -> Delivery:
        """One send; what it raised, or its running out of time, as a failed ``Delivery``."""
        limit = job.time_left()
        mark = OutboxMark(job.msg.idempotency_key, job.attempts) \
            if job.durable and self.store is not None else None
        try:
            async with asyncio.timeout(limit) as timer:
                return await self._send(channel, job.msg, mark)
        except TimeoutError as exc:
            if timer.expired():
                return Delivery(ok=False, error=f"no answer from {channel.name} within "
                                                f"{job.within:g}s", unknown=True)
            return _raised(channel, exc)
        except Exception as exc:
            return _raised(channel, exc)

    async def _send(self, channel: Channel, msg: OutboundMessage,
                    mark: OutboxMark | None) -> Delivery:
        """``msg`` sent; a reply that was shown while written goes into what showed it. A
        channel that sends by writing to our database (``send_marked``) marks the outbox
        row (``mark``) in that write."""
        if msg.stream is not None:
            message_id = await self.streams.settle(msg.stream)
            live = getattr(channel, "live", None)
            if message_id is not None and live is not None:
                return await live.finish(msg, message_id)
        if mark is not None and (marked := getattr(channel, "send_marked", None)) is not None:
            return await marked(msg, mark)
        return await channel.send(msg)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        return BackoffPolicy(self.config.backoff, self.config.max_backoff,
                             jitter=0.5).delay(attempt, retry_after)

    async def _dead(self, job: _Job, error: str) -> None:
        stats = self.stats.get(job.msg.channel)
        if stats is not None:
            stats.dead += 1
        _log.error("gave up sending a %s message to %s:%s after %d attempt(s): %s",
                   job.msg.kind, job.msg.channel, job.msg.chat_id, job.attempts, error)
        if job.durable and self.store is not None:
            await self.store.outbox_result(job.msg.idempotency_key, delivered=False,
                                           attempts=job.attempts, error=error, dead=True)
        if job.msg.stream is not None:  # what the stream showed stays as it is
            await self.streams.forget(job.msg.stream)

    # health --------------------------------------------------------------------------------

    @property
    def delivered(self) -> int:
        return sum(s.sent for s in self.stats.values())

    @property
    def failed(self) -> int:
        return sum(s.dead for s in self.stats.values())


def _raised(channel: Channel, exc: Exception) -> Delivery:
    """A send that raised instead of reporting: whether the platform has the message is not
    known, so it counts as an unknown outcome (resent at most once)."""
    _log.error("channel %s raised while sending: %s", channel.name, one_line(exc))
    return Delivery(ok=False, error=one_line(exc), unknown=True)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one line for health and the log: its message, or its type when bare."""
    text = str(exc).strip()
    if not text or isinstance(exc, (TypeError, KeyError, ValueError, AttributeError)):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 1] + "…"
