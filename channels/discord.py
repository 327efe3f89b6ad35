"""The Discord channel: discord.py 2, its client run as a task inside the gateway's event loop.

Connection. ``start()`` logs in over REST (a refused token fails the start with a clear
message, and the gateway marks the channel down and tries again later; an unreachable Discord
does not: it keeps trying, and status says down), runs ``client.connect()`` in an owned task
and waits up to ``connect_timeout`` for READY. Discord refusing the Message Content intent
(close code 4014) fails the start with the name of the portal switch. Reconnects and RESUMEs
are discord.py's: a resumed session gets every event it missed. When a session cannot be
resumed Discord replays nothing, so after any fresh session but the first the channels the bot
heard from recently are read back over REST, and what was said meanwhile is still answered
(once: message ids are remembered, and the durable inbox de-duplicates too). A watchdog closes
a connection whose heartbeats go unacknowledged for ``watchdog`` seconds (a zombie connection:
discord.py then resumes), and ``status()`` says degraded while the gateway is down or silent. A
gateway can also go deaf with its heartbeats still acknowledged: Discord dispatches the bot's
own messages back to it, so a message sent over REST whose echo does not arrive within
``watchdog`` (``common.Liveness.expect_echo``) marks the channel degraded and the watchdog
reconnects (a RESUME replays what was missed). A login answer discord.py cannot read fails the
start with one line, like a refused token; the gateway keeps running and starts the channel
again later. On several processes (``gateway/cluster.py``) one holds the gateway connection
(the bot token's leader lease: ``connect_gate``); the others log in over REST only and send
(standby), and the one that takes the lease over reads back from the shared cursors; one
that may have lost the lease closes its websocket (``disconnect``) and waits again.

API base. discord.py's REST base and gateway URL are class attributes, global to the process:
set in ``_login()`` (the gateway URL from that server's ``GET /gateway``), restored when the
last channel pointing there stops. Two different ``api_base`` in one process: not supported.

Input. discord.py runs every event handler in a task of its own, so ``on_message`` only queues
the message and one owned worker (``discord_reader``) converts messages in arrival order
(``discord_convert``) for the shared pipeline (``channels.inbound``: access, pairing, group
context, files, storing). Attachments are saved under the workspace's
``inbox/discord/<channel>/``. Output lives in ``discord_outbound``. Replies go out over
REST, which does not need the gateway: an answer produced while the gateway reconnects is sent
all the same, and when REST fails too the outbox retries it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import yarl

from channels.base import ChannelBase, ChannelDeps, ChannelStatus
from channels.common import Liveness, SecretFilter, StateWatch, Typing, iso
from channels.discord_convert import (
    NAME,
    TEXT_LIMIT,
    WORDING,
    access_rules,
    discord,
)
from channels.discord_cursors import Cursors
from channels.discord_library import (
    DEFAULT_API_BASE,
    DEFAULT_GATEWAY,
    PORTAL_SWITCH,
    Client,
    Route,
    close_client,
    heartbeat_ack_age,
    let_go_of_library,
    point_library_at,
)
from channels.discord_live import DiscordLive
from channels.discord_outbound import SEND_ERRORS, Outbound
from channels.discord_reader import Reader
from channels.inbound import Inbound
from channels.reactions import Reactions
from channels.sent_parts import SentParts
from gateway.kernel.backoff import Backoff
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import DiscordChannelConfig
from gateway.kernel.events import ChatActivity, OutboundMessage, utcnow
from gateway.kernel.pairing import PairingStore
from gateway.kernel.store import Store
from gateway.kernel.tasks import TaskSet
from gateway.kernel.values import ChannelHints, Delivery

_log = logging.getLogger(__name__)


class DiscordChannelError(Exception):
    """The channel cannot start (the token or the Message Content intent was refused, the
    login answer could not be read)."""


class DiscordChannel(StateWatch, ChannelBase):
    name = NAME
    config_model = DiscordChannelConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> DiscordChannel:
        """The ``parley.channels`` entry point's factory (its section: ``channels.discord``)."""
        return create(deps)

    hints = ChannelHints(
        markup="Discord markdown, shown natively (bold, italic, underline __x__, "
               "strikethrough, inline code, code blocks with a language, links, lists, quotes, "
               "# headings, ||spoilers||); no tables: use a code block",
        max_length=TEXT_LIMIT,
        etiquette="In servers each message starts with [display name]; answer whoever "
                  "addressed you, briefly. Mentions in your text do not notify anyone.")

    def __init__(self, config: DiscordChannelConfig, *, bus: MessageBus, store: Store,
                 workspace: Path, clock: Callable[[], float] = time.monotonic) -> None:
        """``workspace``: attachments are saved under its ``inbox/discord/<channel>/``;
        ``clock`` (monotonic seconds) drives the typing cap."""
        if config.token is None:
            raise DiscordChannelError("channels.discord.token is required")
        self.config = config
        if config.allow_mentions:
            self.hints = replace(self.hints, etiquette=self.hints.etiquette.replace(
                "Mentions in your text do not notify anyone.",
                "Mentions (<@user id>) notify that person; @everyone and @here never do."))
        self._token = config.token.get_secret_value()
        self._bus = bus
        self._clock = clock
        self.pairing = PairingStore(store)
        self._sent = SentParts(store, NAME)
        self._filter = SecretFilter(self._token)
        self._client: Client | None = None
        self._logged_in = False
        self._outbound = Outbound(self._live_client, self._sent, config, self._token)
        self.live = DiscordLive(self._live_client, self._outbound, self._sent, self._token)
        self._inbound = Inbound(NAME, self._outbound, WORDING, bus=bus, pairing=self.pairing,
                                rules=access_rules(config), workspace=workspace,
                                max_media_bytes=config.max_media_bytes,
                                allow_bots=config.allow_bots)
        self._reader = Reader(self._inbound, client=self._live_client, on_handled=self._notify,
                              cursors=Cursors(store))
        self._read_back_at_start = False
        self.connect_gate: Callable[[], Awaitable[object]] | None = None
        """Several processes (``gateway/cluster.py``): awaited before the gateway websocket
        opens, released once this process holds the bot token's leader lease; until then it
        only sends, over REST (standby)."""
        self.standby = False
        self._tasks = TaskSet()
        self.react = Reactions(NAME, self._tasks,  # type: ignore[method-assign]
                               self.live.reaction).react
        self._typing = Typing(NAME, self._tasks, place=lambda e: e.thread_id or e.chat_id,
                              show=self._show_typing, interval=config.typing_interval,
                              clock=clock)
        self._runner: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._ready = asyncio.Event()
        self._settled = asyncio.Event()
        """Set once there is news for ``start()``: connected, refused, or Discord unreachable."""
        self._running = self._stopped = self._pointed = self._connected = False
        self._sessions = 0
        self.fatal: str | None = None
        self.last_event: datetime | None = None
        self._live = Liveness(receive="gateway event", limit=config.watchdog, clock=clock,
                              silence=False)
        """A quiet server sends nothing: only a missing echo of our own message counts."""
        self._echoed: OrderedDict[int, None] = OrderedDict()
        """Ids of our own messages the gateway dispatched back (recent ones)."""
        self._last_restart = clock()
        self.disconnects = self.resumes = self.catch_ups = self.watchdog_restarts = 0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        self._stopped = False
        self.fatal = None
        self._live.down(None)
        self._sessions = 0
        self._ready.clear()
        self._settled.clear()
        self._filter.cover("discord")
        await self.pairing.setup()
        await self._sent.setup()
        # What was said while the gateway was stopped is read back once connected.
        self._read_back_at_start = await self._reader.restore()
        self._running = True
        runner = self._runner = self._tasks.spawn(self._run(), "discord-gateway")
        self._tasks.spawn(self._reader.run(), "discord-inbound")
        self._tasks.spawn(self._watchdog(), "discord-watchdog")
        waiter = asyncio.create_task(self._settled.wait(), name="discord-wait-ready")
        try:
            await asyncio.wait({runner, waiter}, timeout=self.config.connect_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
        if runner.done() and self.fatal is not None:
            error = self.fatal
            await self.stop()
            raise DiscordChannelError(error)
        if self.standby:
            _log.info("discord channel started as %s, on standby (another process holds the "
                      "gateway connection; this one sends)", self._bot_name())
        elif not self._ready.is_set():
            _log.warning("discord: not connected yet; still trying (status shows it)")
        else:
            _log.info("discord channel started as %s", self._bot_name())

    async def stop(self) -> None:
        """Safe to call twice, and on a channel that never started."""
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        await self._close_connection()
        await self._tasks.cancel_all()
        self._typing.clear()
        if self._pointed:
            let_go_of_library(self)
            self._pointed = False
        self._filter.cover("discord", on=False)
        await self._notify()

    async def _close_connection(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:  # first, so that it makes no new client meanwhile
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        client, self._client = self._client, None
        if client is not None:
            await close_client(client)
        self._logged_in = self._connected = False

    async def disconnect(self) -> None:
        """Back to standby: this process may have lost the connection's lease (the cluster)."""
        if self._running and not self.standby:
            _log.warning("discord: closing the gateway connection (its lease may be lost)")
            await self._close_connection()
            self._runner = self._tasks.spawn(self._run(), "discord-gateway")
            await self._notify()

    def _live_client(self) -> discord.Client | None:
        client = self._client
        if client is None or not self._logged_in or client.is_closed():
            return None
        return client

    # --- the connection -------------------------------------------------------------------------

    async def _login(self, client: Client) -> None:
        """Point discord.py at ``api_base`` (and that server's gateway), then log in."""
        base = self.config.api_base
        if Route.BASE != base:  # (another channel of this process may point there already)
            point_library_at(base, DEFAULT_GATEWAY)
        self._pointed = base != DEFAULT_API_BASE
        await client.login(self._token)
        if self._pointed:
            data = await client.http.request(Route("GET", "/gateway"))
            if not isinstance(data, dict) or not isinstance(data.get("url"), str):
                raise discord.GatewayNotFound()
            point_library_at(base, yarl.URL(data["url"]), by=self)

    async def _run(self) -> None:
        """Log in (retrying while Discord is unreachable), then discord.py's connect loop."""
        backoff = Backoff()
        try:
            while True:
                client = self._client = Client.of(self, self.config)
                try:
                    await self._login(client)
                    break
                except discord.LoginFailure:
                    await client.close()
                    raise DiscordChannelError(
                        f"channels.discord.token was refused by Discord at "
                        f"{self.config.api_base} (copy it again from the developer portal: "
                        "Bot → Reset Token)") from None
                except SEND_ERRORS as exc:
                    await client.close()
                    delay = backoff.next()
                    _log.warning("discord: cannot log in yet (%s: %s); retry in %.1fs",
                                 type(exc).__name__, exc, delay)
                    self._live.down(f"cannot log in yet: {type(exc).__name__}: {exc}")
                    self._settled.set()  # the gateway need not wait for Discord to come back
                    await asyncio.sleep(delay)
                except Exception as exc:  # an answer discord.py could not read
                    await client.close()
                    raise DiscordChannelError(
                        f"Discord at {self.config.api_base} gave a malformed login answer "
                        f"({type(exc).__name__}: {exc})") from None
            self._logged_in = True
            if self.connect_gate is not None:
                await self._standby(self.connect_gate)
            await client.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired:
            await self._fail(PORTAL_SWITCH)
        except DiscordChannelError as exc:
            await self._fail(str(exc))
        except discord.ConnectionClosed as exc:
            await self._fail(f"Discord closed the gateway connection for good (code "
                             f"{exc.code}: {exc.reason or 'no reason given'})")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._fail(f"the gateway connection failed: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}")

    async def _standby(self, gate: Callable[[], Awaitable[object]]) -> None:
        """Send only until this process holds the connection; then read back from where the
        last holder stopped (the cursors are in the shared store), as after a restart."""
        self.standby = True
        self._settled.set()
        await self._notify()
        await gate()
        self.standby = False
        self._read_back_at_start = await self._reader.restore()
        _log.info("discord: this process holds the gateway connection now")

    async def _fail(self, error: str) -> None:
        self.fatal = error
        self._live.down(error)
        self._connected = False
        self._settled.set()
        _log.error("discord: %s", error)
        await self._notify()

    async def _gateway_up(self, *, resumed: bool) -> None:
        self._connected = True
        self._live.received()
        if resumed:
            self.resumes += 1
        else:
            self._sessions += 1
            # A fresh session replays nothing: read back what was missed, after a lost
            # session or, on the first one, since the gateway last ran.
            if self._sessions > 1 or self._read_back_at_start:
                self._tasks.spawn(self._catch_up(), "discord-catch-up")
        self._ready.set()
        self._settled.set()
        await self._notify()

    async def _gateway_down(self) -> None:
        if self._connected:
            self.disconnects += 1
        self._connected = False
        await self._notify()

    def _saw_event(self) -> None:
        self.last_event = utcnow()
        self._live.received()

    def _received(self, message: discord.Message) -> None:
        user = self._client.user if self._client is not None else None
        if user is not None and message.author.id == user.id:
            self._echoed[message.id] = None
            while len(self._echoed) > 1000:
                self._echoed.popitem(last=False)
        if not self._stopped:
            self._reader.put(message)

    async def _watchdog(self) -> None:
        """Close a connection whose heartbeats go unacknowledged (discord.py then resumes)."""
        limit = self.config.watchdog
        while True:
            await asyncio.sleep(min(5.0, limit / 4))
            client = self._client
            if client is None or not self._connected or client.ws is None:
                continue
            age = heartbeat_ack_age(client)
            deaf = self._live.stalled() and self._clock() - self._last_restart > limit
            if (age is not None and age > limit) or deaf:
                if deaf:
                    _log.warning("discord: %s; reconnecting", self._live.state(True)[1])
                else:
                    _log.warning("discord: no heartbeat acknowledged for %.1fs; reconnecting",
                                 age)
                self.watchdog_restarts += 1
                self._last_restart = self._clock()
                try:
                    await client.ws.close(code=4000)
                except Exception as exc:  # already closing: discord.py reconnects anyway
                    _log.debug("discord: closing the silent connection failed: %s", exc)
                await self._notify()

    async def _catch_up(self) -> None:
        self.catch_ups += 1
        await self._reader.catch_up()

    # --- status ---------------------------------------------------------------------------------

    def _bot_name(self) -> str | None:
        user = self._client.user if self._client is not None else None
        return f"@{user.name}" if user is not None else None

    def status(self) -> ChannelStatus:
        client = self._client
        age = heartbeat_ack_age(client) if client is not None and self._connected else None
        state, reason = self._live.state(self._running)
        if self.standby and self._running:
            state, reason = "connected", "standby: another process holds the gateway connection"
        elif state != "down" and not self._connected:
            state, reason = "down", "the gateway is not connected"
        elif state == "connected" and age is not None and age > self.config.watchdog:
            state, reason = "degraded", f"no heartbeat acknowledged for {age:.0f}s"
        if self.fatal:
            state, reason = "down", self.fatal
        latency = client.latency if client is not None and self._connected else math.inf
        detail: dict[str, object] = {
            "bot": self._bot_name(), "connected": self._running and self._connected,
            "standby": self.standby,
            "degraded": self._running and state != "connected",
            "latency_ms": round(latency * 1000) if math.isfinite(latency) else None,
            "last_heartbeat_ack_s": round(age, 1) if age is not None else None,
            "last_event": iso(self.last_event),
            "last_inbound": iso(self._inbound.last_inbound),
            "last_send_ok": iso(self._outbound.last_send_ok),
            "disconnects": self.disconnects, "resumes": self.resumes,
            "catch_ups": self.catch_ups, "watchdog_restarts": self.watchdog_restarts,
            "error": self.fatal}
        return ChannelStatus(running=state == "connected", detail=detail, state=state,
                             reason=reason)

    # --- outbound -------------------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> Delivery:
        """Over REST; a new message should come back on the gateway (``_received``)."""
        delivery = await self._outbound.send(msg)
        if delivery.ok and self._connected and any(
                i.isdigit() and int(i) not in self._echoed for i in delivery.message_ids):
            self._live.expect_echo()
        return delivery

    # --- typing ---------------------------------------------------------------------------------

    def activity(self, event: ChatActivity) -> None:
        """While a chat's turn runs, show "typing…" (Discord shows it for ~10 s per call)."""
        if self._running and event.channel == NAME:
            self._typing.activity(event)

    async def _show_typing(self, target: str) -> None:
        client = self._live_client()
        if client is not None and target.isdigit():
            try:
                await client.get_partial_messageable(int(target)).typing()
            except SEND_ERRORS as exc:
                _log.debug("discord: typing failed: %s", exc)


def create(deps: ChannelDeps) -> DiscordChannel:
    """The gateway's factory for ``channels.discord``."""
    return DiscordChannel(deps.config.channels.discord, bus=deps.bus, store=deps.store,
                          workspace=deps.config.workspace_path, clock=deps.monotonic)
