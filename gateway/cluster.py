"""The cluster worker: on a PostgreSQL store, the part of a gateway process that takes its
share of the work (``gateway/kernel/store_pg_cluster.py`` holds the tables and the SQL).

Claims run when ``NOTIFY parley_inbox`` says a message was stored (by any process) and when
another process's lease runs out (its chats and undelivered replies may need a new holder),
never on a polling timer. A claimed message goes to this process's agent like a message its
own channel received; a claimed reply to its delivery. The lease is renewed every third of
its length; when that fails (the database is gone, or the others gave this process up for
dead) the worker stops claiming and says so in health until a renewal works again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.local import LocalChannel
from channels.telegram import TelegramChannel
from channels.webchat import WebchatChannel
from gateway.delivery import ChannelManager
from gateway.kernel.bus import MessageBus
from gateway.kernel.store import Store
from gateway.kernel.store_pg import PgStore
from gateway.kernel.store_pg_cluster import ClusterStore

_log = logging.getLogger(__name__)


class ClusterWorker:
    def __init__(self, store: PgStore, bus: MessageBus, manager: ChannelManager, *,
                 lease: float, channels: list[str]) -> None:
        self.cluster = ClusterStore(store, lease=lease, channels=channels)
        self.bus = bus
        self.manager = manager
        self._taking_work = False
        self.problem: str | None = None
        self.claimed = 0
        self.members: list[dict[str, Any]] = []
        self.unclaimed = 0
        """Inbound messages no live process had claimed, as of the last renewal."""
        self.leaders: dict[str, Callable[[], Awaitable[None]]] = {}
        """Work one process does at a time (the schedules): started here when this process
        takes the leader lease of its name, at start or when its holder died."""
        self.leading: set[str] = set()
        self.yielders: dict[str, Callable[[], Awaitable[None]]] = {}
        """What a leader does when this process may have lost its lease (no renewal for two
        thirds of it): close its connection, before the others may take it over."""
        self._renewed_at = 0.0
        self._renewed = asyncio.Event()
        self._wake = asyncio.Event()
        self._waiting = False
        self.reply_watchers: dict[str, list[Callable[[str], Awaitable[None]]]] = {}
        """Per notification channel (``parley_local``, ``parley_webchat``): told the chat of
        each local-channel reply or WebChat answer any process stored."""
        self.cron_watchers: list[Callable[[], None]] = []
        """Woken when another process added, removed or asked to run a cron job (the
        scheduler, where this process runs it)."""
        self._replies: set[tuple[str, str]] = set()
        self._replied = asyncio.Event()
        self._closing = False
        self._claiming: list[asyncio.Task[None]] = []
        """Listening and claiming: ended first by a clean stop (``stop_claiming``)."""
        self._renewing: asyncio.Task[None] | None = None

    @property
    def me(self) -> str:
        return self.cluster.me

    @property
    def taking_work(self) -> bool:
        return self._taking_work

    @taking_work.setter
    def taking_work(self, taking: bool) -> None:
        """While it takes work (and is not stopping) the process claims the messages it stores
        for the chats it holds as it stores them (``PgStore.inbox_take``)."""
        self._taking_work = taking
        store = self.cluster.store
        store.claimer = self.me if taking and not self._closing else None
        store.takes_free = frozenset(name for name, channel in self.manager.channels.items()
                                     if isinstance(channel, LocalChannel | WebchatChannel))

    async def start(self) -> None:
        asked = asyncio.get_running_loop().time()
        await self.cluster.join()
        self._renewed_at = asked
        await self.cluster.listen()
        self.taking_work = True
        await self._round()  # what the last run (or a dead process) left, first
        await self._look()
        self._claiming = [asyncio.create_task(self._listen(), name="cluster-listen"),
                          asyncio.create_task(self._claims(), name="cluster-claims"),
                          asyncio.create_task(self._relay_replies(), name="cluster-replies"),
                          asyncio.create_task(self._hold_leads(), name="cluster-leads")]
        self._renewing = asyncio.create_task(self._renewals(), name="cluster-lease")

    async def stop_claiming(self) -> None:
        """The start of a clean stop: no more messages, replies or leader leases taken (a
        peer leaving wakes this process; it must not take the schedules while it stops). The
        lease is still renewed while the turns in hand finish."""
        self._closing = True
        self.cluster.store.claimer = None
        for task in self._claiming:
            task.cancel()
        await asyncio.gather(*self._claiming, return_exceptions=True)
        self._claiming.clear()

    async def stop(self) -> None:
        await self.stop_claiming()
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
            self._renewing = None
        await self.cluster.close()
        if self.taking_work:
            try:
                await self.cluster.leave()
            except Exception:  # the others take over when the lease runs out
                _log.warning("could not hand back this process's chats; the others take "
                             "them over when its lease runs out")

    def _sure_alive(self) -> bool:
        """Renewed within two thirds of a lease: the others cannot have given it up."""
        left = self._renewed_at + self.cluster.lease * 2 / 3
        return asyncio.get_running_loop().time() < left

    async def try_lead(self) -> None:
        for name, start in self.leaders.items():
            if self._closing or not self._sure_alive():
                return
            if name not in self.leading and await self.cluster.lead(name):
                self.leading.add(name)
                _log.info("cluster: this process now runs %s", name)
                await start()

    async def _hold_leads(self) -> None:
        """Gives up the leader leases that can be given up (``yielders``) once this process
        has not renewed its own lease for two thirds of it (its renewals fail, or hang): the
        others take them over a lease after the last renewal, and by then the connection is
        closed here (one Discord websocket, one Telegram poller at any time). They are taken
        again once a renewal works and they are still free."""
        loop = asyncio.get_running_loop()
        while True:
            if self._sure_alive():
                left = self._renewed_at + self.cluster.lease * 2 / 3 - loop.time()
                self._renewed.clear()
                try:  # the deadline of this process's lease as it knows it, not a poll
                    async with asyncio.timeout(left):
                        await self._renewed.wait()
                except TimeoutError:
                    pass
                continue
            if not self.leading & self.yielders.keys():
                self._renewed.clear()
                await self._renewed.wait()
                continue
            await self.step_down()
            self._renewed.clear()
            await self._renewed.wait()
            try:  # alive again: what is still free is this process's again (nothing else
                await self.try_lead()  # may wake it: a lone process has no peers)
            except Exception as exc:
                _log.warning("cluster: taking the leader leases back failed: %s", exc)

    async def step_down(self) -> None:
        for name in sorted(self.leading & self.yielders.keys()):
            self.leading.discard(name)
            _log.warning("cluster: this process may have lost its lease; it gives up %s", name)
            try:
                await self.yielders[name]()
            except Exception:
                _log.exception("cluster: giving up %s failed", name)

    async def _round(self) -> None:
        await self.try_lead()
        claimed = await self.cluster.claim()
        for msg in claimed.inbound:
            await self.bus.enqueue_claimed(msg)
        self.claimed += len(claimed.inbound)
        self._waiting = claimed.waiting
        if claimed.outbound:
            await self.manager.resend(claimed.outbound)

    async def _listen(self) -> None:
        async for channel, payload, mine in self.cluster.notifications():
            if channel in ("parley_local", "parley_webchat"):
                if mine:  # its own reply: the channel read it as it stored it (no second read)
                    continue
                self._replies.add((channel, payload))
                self._replied.set()
            elif channel == "parley_cron":
                for wake in self.cron_watchers:
                    wake()
            else:
                self._wake.set()

    async def _relay_replies(self) -> None:
        """The chats any process stored a local-channel reply or a WebChat answer to, handed
        to this process's channel (its long polls and open pages here get them): the local
        channel and WebChat answer on every process."""
        while True:
            await self._replied.wait()
            self._replied.clear()
            chats, self._replies = self._replies, set()
            for channel, chat in chats:
                for watcher in self.reply_watchers.get(channel, ()):
                    try:
                        await watcher(chat)
                    except Exception as exc:
                        _log.warning("reading another process's reply failed: %s", exc)

    async def _claims(self) -> None:
        while True:
            left = await self.cluster.next_expiry()
            if self._waiting:  # another process's chats have work: look again within a lease
                left = min(left if left is not None else self.cluster.lease, self.cluster.lease)
            try:  # not asyncio.wait_for: on 3.11 it swallows a cancel that comes as the
                # wake-up does (gh-86296), and a stopping gateway then waited here for ever
                async with asyncio.timeout(None if left is None else left + 0.05):
                    await self._wake.wait()
            except TimeoutError:
                pass  # a peer's lease ran out: its chats may need this process
            self._wake.clear()
            if self.taking_work:
                try:
                    await self._round()
                except Exception as exc:
                    _log.error("claiming work failed: %s", exc)

    async def _renewals(self) -> None:
        while True:
            await asyncio.sleep(self.cluster.lease / 3)  # the lease's heartbeat, not a poll
            asked = asyncio.get_running_loop().time()  # the lease runs from before the ask
            if await self.cluster.renew():
                self._renewed_at = asked
                self._renewed.set()
                try:
                    await self._look()
                except Exception:
                    pass
                if not self.taking_work:
                    try:  # back as a live process (its old claims may be the others' now)
                        await self.cluster.join()
                    except Exception as exc:  # its store's connection not back yet
                        _log.warning("cluster: rejoining failed: %s", exc)
                        continue
                    _log.warning("cluster: the database answers again; taking work")
                self.taking_work, self.problem = True, None
                continue
            if self.taking_work:
                self.problem = "lost the database or its lease: not taking new work"
                _log.error("cluster: %s", self.problem)
            self.taking_work = False
            try:  # back as a live process (its old claims may be the others' now: fenced)
                await self.cluster.join()
            except Exception:
                continue

    async def _look(self) -> None:
        """The processes and queues health shows (read at each renewal, not per request)."""
        self.members = await self.cluster.members()
        self.unclaimed = await self.cluster.unclaimed()

    def connections(self) -> dict[str, str]:
        """Which process holds each leader lease (a platform connection, ``telegram:<hash>``
        or ``discord:<hash>`` of its bot token; ``schedules``), as of the last renewal."""
        return {lead: m["id"] for m in self.members for lead in m["leads"]}

    def health(self) -> dict[str, Any]:
        """This process and the others as of the last renewal (no I/O: health is cheap)."""
        out: dict[str, Any] = {"process": self.me, "taking_work": self.taking_work,
                               "claimed": self.claimed, "unclaimed": self.unclaimed,
                               "lease_seconds": self.cluster.lease,
                               "processes": self.members,
                               "connections": self.connections()}
        if self.problem:
            out["problem"] = self.problem
        return out


def connection_lease(platform: str, token: str) -> str:
    """The leader lease's name for one platform connection of a bot token: the platform and
    a hash of the token (never the token: the name shows in health and the database)."""
    return f"{platform}:{hashlib.sha256(token.encode()).hexdigest()[:12]}"


def cluster_worker(store: Store, bus: MessageBus, manager: ChannelManager, *, lease: float,
                   channels: list[str]) -> ClusterWorker:
    """The worker for this process, with a leader lease per connection only one process may
    hold: a Telegram bot token's getUpdates poller, a Discord bot token's gateway websocket
    (the others only send, on standby, and take the connection over when its holder dies).
    Telegram's webhook mode needs none: every process serves the webhook, the inbox's unique
    key stores a retried update once."""
    assert isinstance(store, PgStore)
    worker = ClusterWorker(store, bus, manager, lease=lease, channels=channels)
    for channel in manager.channels.values():
        if isinstance(channel, LocalChannel):
            worker.reply_watchers.setdefault("parley_local", []).append(
                channel.replies_elsewhere)
        if isinstance(channel, WebchatChannel):
            worker.reply_watchers.setdefault("parley_webchat", []).append(
                channel.answers_elsewhere)
        if isinstance(channel, TelegramChannel) and channel.config.mode == "polling":
            token = channel.config.token.get_secret_value() if channel.config.token else ""
            channel.poll_gate = _gate(worker, connection_lease("telegram", token),
                                      channel.stop_polling)
        if channel.name == "discord":
            from channels.discord import DiscordChannel  # discord.py only where it is used

            if isinstance(channel, DiscordChannel):
                token = channel.config.token.get_secret_value() if channel.config.token else ""
                channel.connect_gate = _gate(worker, connection_lease("discord", token),
                                             channel.disconnect)
    return worker


def _gate(worker: ClusterWorker, name: str,
          close: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[object]]:
    """What a channel awaits before it opens the connection only the lease's holder opens:
    released when this process takes the leader lease ``name``, closed again (and ``close``
    awaited: the channel goes back to standby) when this process may have lost it."""
    held = asyncio.Event()

    async def start() -> None:
        held.set()

    async def give_up() -> None:
        held.clear()
        await close()

    worker.leaders[name] = start
    worker.yielders[name] = give_up
    return held.wait
