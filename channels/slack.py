"""The Slack channel: a Slack app over Socket Mode (slack-sdk's aiohttp ``SocketModeClient``),
so no public URL is needed; replies and files over the Web API (``slack_outbound``).

Connection. ``start()`` checks the bot token (``auth.test``: the bot's own user id, for
mentions) and the app token (``apps.connections.open``) — either refused fails the start with
one line naming the key, and the gateway tries again later — then connects the socket and
waits up to ``CONNECT_WAIT`` seconds for Slack's ``hello``. Reconnects are the library's: a
``disconnect`` message (Slack refreshes connections every few hours), a closed socket or
unanswered pings make it fetch a new URL and connect again. Health comes from what arrived
(``common.Liveness``): *down* until a ``hello`` on the current socket, and while it is closed;
Slack sends the bot its own messages back, so a reply whose echo does not arrive within
``watchdog`` marks the channel *degraded* (a deaf socket) and the watchdog reconnects.

Input. Each ``events_api`` envelope is queued, and one owned worker converts the events in
arrival order (``slack_convert``) for the shared pipeline (``channels.inbound``: access,
pairing, group context, files into the workspace's ``inbox/``, storing); an envelope is
acknowledged once its message is stored, so Slack delivers again what the gateway could not
take. While a turn runs, the message it answers wears 👀 (``reactions``); with
``streaming.reactions`` each stage of it shows instead (``slack_live``). With ``streaming``
on, the answer is shown while it is written, in one message updated in place
(``slack_live``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import ChannelBase, ChannelDeps, ChannelStatus
from channels.common import Liveness, SecretFilter, StateWatch, iso
from channels.inbound import Inbound
from channels.incoming import Incoming
from channels.reactions import Reactions
from channels.sent_parts import SentParts
from channels.slack_convert import (
    NAME,
    TEXT_LIMIT,
    WORDING,
    access_rules,
    is_own,
    profile_name,
    to_incoming,
)
from channels.slack_live import FULL, WHILE_RUNNING, SlackLive
from channels.slack_outbound import Outbound
from gateway.kernel.bus import MessageBus
from gateway.kernel.config_channels import SlackChannelConfig
from gateway.kernel.events import ChatActivity, MessageStage, OutboundMessage, Stage
from gateway.kernel.pairing import PairingStore
from gateway.kernel.store import Store
from gateway.kernel.tasks import TaskSet
from gateway.kernel.values import ChannelHints, Delivery

_log = logging.getLogger(__name__)

CONNECT_WAIT = 30.0
MAX_NAMES = 5000
Key = tuple[str, str | None]


class SlackChannelError(Exception):
    """Slack cannot be used as configured (a refused token, an unreachable API)."""


class SlackChannel(StateWatch, ChannelBase):
    name = NAME
    config_model = SlackChannelConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> SlackChannel:
        """The ``parley.channels`` entry point's factory (``channels.slack``)."""
        return create(deps)

    hints = ChannelHints(
        markup="Markdown, shown as Slack mrkdwn (bold, italic, strikethrough, inline code, "
               "code blocks, links, lists); no tables: use a code block",
        max_length=TEXT_LIMIT,
        etiquette="In channels you answer when mentioned; answer whoever addressed you, "
                  "briefly.")

    def __init__(self, config: SlackChannelConfig, *, bus: MessageBus, store: Store,
                 workspace: Path, clock: Callable[[], float] = time.monotonic) -> None:
        if config.bot_token is None or config.app_token is None:
            raise SlackChannelError("channels.slack.bot_token and app_token are required")
        self.config = config
        self._bot_token = config.bot_token.get_secret_value()
        self._app_token = config.app_token.get_secret_value()
        self._filter = SecretFilter(self._bot_token, self._app_token)
        self.pairing = PairingStore(store)
        self._web: AsyncWebClient | None = None
        self._socket: SocketModeClient | None = None
        self._sent = SentParts(store, NAME)
        self._outbound = Outbound(lambda: self._web, self._sent,
                                  bot_token=self._bot_token, app_token=self._app_token,
                                  max_media_bytes=config.max_media_bytes)
        self._inbound = Inbound(NAME, self._outbound, WORDING, bus=bus, pairing=self.pairing,
                                rules=access_rules(config), workspace=workspace,
                                max_media_bytes=config.max_media_bytes)
        self.live = SlackLive(lambda: self._web, self._outbound, self._sent)
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._tasks = TaskSet()
        self._stages = config.streaming.reactions
        """Every stage of a message shows (the gateway calls ``react``); else 👀 while its
        turn runs, from ``activity``."""
        self._reactions = Reactions(NAME, self._tasks, self.live.reaction,
                                    FULL if self._stages else WHILE_RUNNING)
        self._changed = asyncio.Condition()
        self._live = Liveness(receive="Socket Mode event", limit=config.watchdog, clock=clock,
                              silence=False)
        """A quiet workspace sends nothing: only a missing echo of our own message counts."""
        self._running = False
        self._connected = False
        self._why_not: str | None = "not connected yet"
        self._answering: dict[Key, str] = {}
        """The last message that addressed the bot, per chat and thread (for the reaction)."""
        self._reacted: dict[Key, str] = {}
        self._names: dict[str, str] = {}
        """User id → name, for events without a profile (``users.info``, once each)."""
        self.bot_user: str | None = None
        self.bot_id: str | None = None
        self.hellos = 0
        self.disconnects = 0
        self.handled = 0
        self.watchdog_restarts = 0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        self._filter.cover("slack_sdk")
        await self.pairing.setup()
        await self._sent.setup()
        web = AsyncWebClient(token=self._bot_token, base_url=self.config.api_base,
                             retry_handlers=[], timeout=30)
        self.bot_user, self.bot_id = await self._who_am_i(web)
        socket = SocketModeClient(app_token=self._app_token, web_client=web,
                                  ping_interval=self.config.ping_interval,
                                  auto_reconnect_enabled=True)
        socket.socket_mode_request_listeners.append(self._on_request)
        socket.message_listeners.append(self._on_message)
        socket.on_message_listeners.append(self._on_frame)
        socket.on_close_listeners.append(self._on_close)
        try:
            socket.wss_uri = await socket.issue_new_wss_url()
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            await socket.close()
            raise SlackChannelError(self._refused("app_token", "apps.connections.open",
                                                  exc)) from None
        self._web, self._socket = web, socket
        self._outbound.open()
        self._running = True
        self._live.watching()
        self._tasks.spawn(self._read(), "slack-inbound")
        self._tasks.spawn(self._watchdog(), "slack-watchdog")
        self._tasks.spawn(socket.connect(), "slack-connect")
        try:
            await self.wait_until(lambda c: c._connected, timeout=CONNECT_WAIT)
            _log.info("slack channel started as %s", self.bot_user)
        except TimeoutError:
            _log.warning("slack: not connected yet; still trying (status shows it)")

    async def _who_am_i(self, web: AsyncWebClient) -> tuple[str, str | None]:
        try:
            auth = await web.auth_test()
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise SlackChannelError(self._refused("bot_token", "auth.test", exc)) from None
        return str(auth["user_id"]), auth.get("bot_id")

    def _refused(self, key: str, call: str, exc: Exception) -> str:
        if isinstance(exc, SlackApiError):
            return (f"channels.slack.{key} refused by Slack ({call}: "
                    f"{exc.response.get('error')})")
        return self._outbound.clean(f"cannot reach Slack at {self.config.api_base} ({call}: "
                                    f"{type(exc).__name__}: {exc})")

    async def stop(self) -> None:
        """Safe to call twice, and on a channel that never started."""
        self._running = False
        self._connected = False
        await self._tasks.cancel_all()
        socket, self._socket = self._socket, None
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.close()
        self._web = None
        await self._outbound.close()
        self._reacted.clear()
        self._filter.cover("slack_sdk", on=False)

    # --- the socket -----------------------------------------------------------------------------

    async def _on_message(self, client: Any, message: dict[str, Any], raw: str | None) -> None:
        if message.get("type") == "hello" and client is self._socket:
            self._connected, self._why_not = True, None
            self.hellos += 1
            self._live.received()
            await self._notify()

    async def _on_frame(self, frame: aiohttp.WSMessage) -> None:
        """Raw frames: a ``disconnect`` (the library reconnects at once) is not handed to the
        other listeners."""
        data = frame.data if isinstance(frame.data, str) else ""
        if '"disconnect"' in data:
            with contextlib.suppress(ValueError):
                reason = json.loads(data).get("reason")
                self._lost(f"Slack asked to reconnect ({reason}); reconnecting")

    async def _on_close(self, frame: aiohttp.WSMessage) -> None:
        self._lost("the Socket Mode connection closed; reconnecting")

    def _lost(self, why: str) -> None:
        if self._connected:
            self.disconnects += 1
        self._connected, self._why_not = False, why

    async def _on_request(self, client: Any, req: SocketModeRequest) -> None:
        """Runs in a task of its own per envelope: only queue, so the order is kept."""
        self._live.received()
        event = (req.payload or {}).get("event") or {} if req.type == "events_api" else {}
        if not event or is_own(event, self.bot_user or "", self.bot_id):
            await self._ack(req.envelope_id)  # our own echo, or nothing we take
            return
        self._queue.put_nowait((req.envelope_id, event))

    async def _ack(self, envelope_id: str) -> None:
        socket = self._socket
        if socket is None:
            return
        try:
            await socket.send_socket_mode_response(SocketModeResponse(envelope_id=envelope_id))
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            _log.info("slack: acknowledging %s failed (%s); Slack will deliver it again",
                      envelope_id, exc)

    async def _read(self) -> None:
        while True:
            envelope_id, event = await self._queue.get()
            if await self._inbound.take(self._convert(event), f"message {event.get('ts')}"):
                await self._ack(envelope_id)  # stored: Slack need not deliver it again
            self.handled += 1
            await self._notify()

    async def _convert(self, event: dict[str, Any]) -> Incoming | None:
        user = event.get("user")
        if isinstance(user, str) and not event.get("user_profile") and user not in self._names:
            await self._look_up(user)
        inc = to_incoming(event, bot_user=self.bot_user or "", names=self._names)
        if inc is not None and inc.addressed:
            self._answering[(inc.chat_id, inc.thread_id)] = inc.id
            while len(self._answering) > 1000:
                self._answering.pop(next(iter(self._answering)))
        return inc

    async def _look_up(self, user: str) -> None:
        """A person's name (``users.info``), once; their id stands in when Slack won't say."""
        web, name = self._web, None
        if web is not None:
            try:
                answer = await web.users_info(user=user)
                info = answer.get("user") or {}
                name = profile_name(info.get("profile") or {}) or info.get("real_name")
            except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                _log.info("slack: no name for %s (%s)", user, self._outbound.clean(str(exc)))
        self._names[user] = str(name or user)
        while len(self._names) > MAX_NAMES:
            self._names.pop(next(iter(self._names)))

    async def _watchdog(self) -> None:
        """A socket that stopped delivering (our echo did not come) is replaced."""
        every = max(1.0, min(self.config.watchdog / 3, 30.0))
        while True:
            await asyncio.sleep(every)
            socket = self._socket
            if socket is not None and self._live.stalled():
                self.watchdog_restarts += 1
                _log.warning("slack: %s; reconnecting", self._live.state(True)[1])
                self._lost("no echo of a sent message: the socket went deaf; reconnecting")
                try:
                    await socket.connect_to_new_endpoint(force=True)
                except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                    _log.warning("slack: reconnecting failed: %s",
                                 self._outbound.clean(str(exc)))

    def status(self) -> ChannelStatus:
        socket = self._socket
        session = socket.current_session if socket is not None else None
        open_ = self._connected and session is not None and not session.closed
        state, reason = self._live.state(self._running)
        if state != "down" and not open_:
            state, reason = "down", self._why_not or "the Socket Mode connection is closed"
        detail: dict[str, object] = {
            "bot": self.bot_user, "connected": self._running and open_,
            "degraded": self._running and state != "connected",
            "last_event": iso(self._live.last_receive_at),
            "last_inbound": iso(self._inbound.last_inbound),
            "last_send_ok": iso(self._outbound.last_send_ok),
            "connections": self.hellos, "disconnects": self.disconnects,
            "watchdog_restarts": self.watchdog_restarts}
        return ChannelStatus(running=state == "connected", detail=detail, state=state,
                             reason=reason)

    # --- outbound -------------------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> Delivery:
        """Over the Web API; Slack should send the new message back on the socket."""
        delivery = await self._outbound.send(msg)
        if delivery.ok and delivery.message_ids and self._connected:
            self._live.expect_echo()
        return delivery

    def react(self, event: MessageStage) -> None:
        """Each stage of a person's message (``streaming.reactions``)."""
        if self._running and self._stages:
            self._reactions.react(event)

    def activity(self, event: ChatActivity) -> None:
        """👀 on the message being answered while its turn runs (``reactions``), through the
        same ``Reactions`` (taken, then done: taken away)."""
        if not (self._running and self.config.reactions and not self._stages
                and event.channel == NAME):
            return
        key = (event.chat_id, event.thread_id)
        stage: Stage
        if event.busy:
            ts = self._answering.get(key)
            if ts is None or self._reacted.get(key) == ts:
                return
            self._reacted[key], stage = ts, "taken"
        else:
            ts = self._reacted.pop(key, None)
            if ts is None:
                return
            stage = "done"
        self._reactions.react(MessageStage(channel=NAME, chat_id=event.chat_id,
                                           message_id=ts, stage=stage,
                                           thread_id=event.thread_id))


def create(deps: ChannelDeps) -> SlackChannel:
    """The gateway's factory for ``channels.slack``."""
    return SlackChannel(deps.config.channels.slack, bus=deps.bus, store=deps.store,
                        workspace=deps.config.workspace_path, clock=deps.monotonic)
