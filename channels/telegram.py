"""The Telegram channel: python-telegram-bot 22, driven inside the gateway's event loop.

Transport. Long polling by default, with our own loop over ``getUpdates`` rather than PTB's
``Updater``, because the offset is ours to move: it advances past an update only once the
shared inbound pipeline has stored its messages (or skipped it, or given up storing it).
Updates that arrived while the gateway was down are fetched on start; on stop the last offset
is confirmed to Telegram. A watchdog rebuilds the polling client (a new ``Bot`` and HTTP pool)
when no ``getUpdates`` has *completed* for ``watchdog`` seconds, and ``status()`` says degraded
meanwhile, with the reason (``common.Liveness``: the time of the last completed poll, which a
rebuild does not reset); a successful send never counts as a sign of life. Only getMe must
work before polling starts (a refused token, a malformed answer or an unreachable API fail
the start with one line, and the gateway tries again later); the command menu and the webhook
cleanup are optional calls retried in the background under their own names, so they never
keep the bot from receiving. ``mode: webhook`` serves
``POST`` on ``webhook_url``'s path and answers 200 only after handling (503 while stopping, so
Telegram retries); the secret token header is required, and stopping leaves the webhook
registered so Telegram keeps updates for the next start.

Output. Markdown is chunked under 4096 UTF-16 units, each chunk rendered to Telegram HTML and
sent; a chunk whose HTML Telegram refuses is resent as plain text. Each part sent is recorded
(``SentParts``), so a retried message resumes after the parts already delivered and nothing is
delivered twice, across restarts too.

Input. Each message is converted (``telegram_convert.incoming``, pure) and handed to the shared
pipeline (``channels.inbound``: access, pairing, group context, files, storing); downloads and
notices go through ``telegram_outbound``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Bot, BotCommand, Message, Update, User
from telegram.constants import ChatAction
from telegram.error import RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from channels.base import ChannelBase, ChannelDeps, ChannelStatus
from channels.common import Liveness, SecretFilter, StateWatch, Typing, iso, optional, redact
from channels.http_api import listen
from channels.inbound import Inbound
from channels.incoming import Incoming
from channels.reactions import Reactions
from channels.sent_parts import SentParts
from channels.telegram_convert import (
    ALLOWED_UPDATES,
    NAME,
    WORDING,
    access_rules,
    incoming,
    retry_seconds,
    start_error,
)
from channels.telegram_live import REACTIONS, TelegramLive
from channels.telegram_outbound import Outbound
from gateway.kernel.backoff import Backoff, BackoffPolicy
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import TelegramChannelConfig
from gateway.kernel.events import ChatActivity, OutboundMessage, utcnow
from gateway.kernel.pairing import PairingStore
from gateway.kernel.store import Store
from gateway.kernel.tasks import TaskSet
from gateway.kernel.values import COMMAND_DESCRIPTIONS, ChannelHints, Delivery

_log = logging.getLogger(__name__)

_LOGGERS_WITH_URLS = ("telegram", "httpx", "httpcore")
"""PTB's and httpx's loggers print request URLs, and the token is in every one of them."""


class TelegramChannelError(Exception):
    """The channel cannot start (the token was refused, getMe's answer was unreadable or did
    not come, the webhook port is taken)."""


class TelegramChannel(StateWatch, ChannelBase):
    name = NAME
    config_model = TelegramChannelConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> TelegramChannel:
        """The ``parley.channels`` entry point's factory (``channels.telegram``)."""
        return create(deps)

    hints = ChannelHints(
        markup="Markdown, shown as Telegram formatting (bold, italic, strikethrough, inline "
               "code, code blocks with a language, links, lists, quotes; headings become bold, "
               "tables become monospace)",
        max_length=4096,
        etiquette="In groups each message starts with [sender name]; answer whoever addressed "
                  "you, briefly.")

    def __init__(self, config: TelegramChannelConfig, *, bus: MessageBus, store: Store,
                 workspace: Path, commands: Mapping[str, str] = COMMAND_DESCRIPTIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``workspace``: files people send are saved under its ``inbox/telegram/<chat>/``;
        ``clock`` (monotonic seconds) drives the watchdog and the typing cap."""
        if config.token is None:
            raise TelegramChannelError("channels.telegram.token is required")
        self.config = config
        self._token = config.token.get_secret_value()
        secret = config.webhook_secret
        self._webhook_secret = secret.get_secret_value() if secret else ""
        self._bus = bus
        self._commands = dict(commands)
        self._addressed_by = [*self._commands, "start"]
        """Commands that address the bot in a group without naming it (``/start`` too)."""
        self._clock = clock
        self.pairing = PairingStore(store)
        self._sent = SentParts(store, NAME)
        self._filter = SecretFilter(self._token, self._webhook_secret)
        self._filter.cover(*_LOGGERS_WITH_URLS)  # before the first Bot: PTB logs its URLs
        self._bot = self._new_bot()
        self._outbound = Outbound(self._bot, self._sent, self._token)
        self.live = TelegramLive(self._bot, self._outbound, self._sent, self._token)
        self._inbound = Inbound(NAME, self._outbound, WORDING, bus=bus, pairing=self.pairing,
                                rules=access_rules(config), workspace=workspace,
                                max_media_bytes=config.max_media_bytes)
        self._me: User | None = None
        self._running = False
        self._stopped = False
        self._offset: int | None = None
        self._seen_updates: OrderedDict[int, None] = OrderedDict()
        self._tasks = TaskSet()
        self.react = Reactions(NAME, self._tasks, self.live.reaction,  # type: ignore[method-assign]
                               REACTIONS).react
        self._typing = Typing(NAME, self._tasks, place=lambda e: (e.chat_id, e.thread_id),
                              show=self._show_typing, interval=config.typing_interval,
                              clock=clock)
        self._poller: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self.poll_gate: Callable[[], Awaitable[object]] | None = None
        """Several processes (gateway/cluster.py): polling waits for this, i.e. until this
        process holds the bot token's leader lease; until then it only sends (standby)."""
        self.standby = False
        self._runner: web.AppRunner | None = None
        self._webhook_ok = False
        self._changed = asyncio.Condition()
        self._live = Liveness(receive="getUpdates", clock=clock,
                              limit=config.watchdog if config.mode == "polling" else None)
        self._last_restart = clock()
        watchdog = config.watchdog
        self._poll_policy = BackoffPolicy(base=min(0.5, watchdog / 16), cap=min(30.0, watchdog / 4))
        """Failed polls are retried at least every quarter ``watchdog``: a return is seen soon."""
        self.last_poll_ok: datetime | None = None
        self.watchdog_restarts = 0
        self.webhook_port: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def _new_bot(self, *, polling: bool = False) -> Bot:
        """A ``Bot`` with its own HTTP pools; the long poll gets a read timeout above its own."""
        wait = self.config.poll_timeout + 10.0
        return Bot(self._token, base_url=self.config.base_url,
                   base_file_url=self.config.base_file_url,
                   request=HTTPXRequest(connection_pool_size=16, connect_timeout=10.0,
                                        read_timeout=30.0, write_timeout=60.0, pool_timeout=10.0),
                   get_updates_request=HTTPXRequest(connect_timeout=10.0, read_timeout=wait)
                   if polling else None)

    async def start(self) -> None:
        """getMe first (the bot's id and name, for mentions); when it fails the channel does
        not start, with one line saying why (the gateway keeps running and tries again)."""
        if self._running:
            return
        self._stopped = False
        self._filter.cover(*_LOGGERS_WITH_URLS)
        await self.pairing.setup()
        await self._sent.setup()
        self._live.watching()
        try:
            await self._bot.initialize()
            self._me = self._bot.bot
        except Exception as exc:
            await self._close_bot()
            raise TelegramChannelError(start_error(exc, self.config.base_url,
                                                  self._redact)) from None
        self._running = True
        self._last_restart = self._clock()
        self._tasks.spawn(optional("setMyCommands", self._set_commands, clean=self._redact,
                                   label="telegram: "), "telegram-commands")
        if self.config.mode == "webhook":
            await self._start_webhook()
        else:
            self._tasks.spawn(optional("deleteWebhook", self._delete_webhook,
                                       clean=self._redact, label="telegram: "),
                              "telegram-delete-webhook")
            self._tasks.spawn(self._gated_poll(), "telegram-poll-gate")
        _log.info("telegram channel started (%s)%s", self.config.mode,
                  f" as @{self._me.username}" if self._me else "")

    async def _gated_poll(self) -> None:
        if self.poll_gate is not None:
            self.standby = True
            await self.poll_gate()
            self.standby = False
            _log.info("telegram: this process polls the bot now")
        self._poller = self._tasks.spawn(self._poll(), "telegram-poll")
        self._watching = self._tasks.spawn(self._watchdog(), "telegram-watchdog")

    async def stop_polling(self) -> None:
        """Back to standby: this process may have lost the bot's polling lease (the cluster)."""
        if self._running and self.poll_gate is not None and not self.standby:
            _log.warning("telegram: no longer polling (its lease may be lost)")
            for task in (self._watching, self._poller):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            self._poller = self._watching = None
            self._offset = None  # the next holder confirms what was stored
            self._tasks.spawn(self._gated_poll(), "telegram-poll-gate")

    async def _set_commands(self) -> None:
        await self._bot.set_my_commands(
            [BotCommand(n, d[:256]) for n, d in self._commands.items()])

    async def _delete_webhook(self) -> None:
        await self._bot.delete_webhook(drop_pending_updates=False)

    async def stop(self) -> None:
        """Safe to call twice, and on a channel that never started (the log filter goes)."""
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        await self._tasks.cancel_all()
        self._typing.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._offset is not None:
            try:  # confirm what was stored, so the next start does not fetch it again
                async with asyncio.timeout(3.0):
                    await self._bot.get_updates(offset=self._offset, timeout=0, limit=1,
                                                allowed_updates=ALLOWED_UPDATES)
            except (TelegramError, TimeoutError) as exc:
                _log.info("telegram: could not confirm offset on stop: %s", self._redact(str(exc)))
        await self._close_bot()
        self._filter.cover(*_LOGGERS_WITH_URLS, on=False)
        async with self._changed:
            self._changed.notify_all()

    async def _close_bot(self) -> None:
        try:
            await self._bot.shutdown()
        except Exception:
            _log.exception("telegram: bot shutdown failed")

    def _redact(self, text: str) -> str:
        return redact(text, (self._token,))

    def status(self) -> ChannelStatus:
        state, reason = self._live.state(self._running)
        if self.standby and self._running:
            state, reason = "connected", "standby: another process polls this bot"
        if state == "connected" and self.config.mode == "webhook" and not self._webhook_ok:
            state, reason = "degraded", "setWebhook has not worked yet"
        detail: dict[str, object] = {
            "mode": self.config.mode, "bot": f"@{self._me.username}" if self._me else None,
            "degraded": state == "degraded", "last_poll_ok": iso(self.last_poll_ok),
            "last_inbound": iso(self._inbound.last_inbound),
            "last_send_ok": iso(self._outbound.last_send_ok),
            "watchdog_restarts": self.watchdog_restarts, "offset": self._offset}
        return ChannelStatus(running=state == "connected", detail=detail, state=state,
                             reason=reason)

    # --- polling and the watchdog ---------------------------------------------------------------

    async def _poll(self) -> None:
        """getMe on a fresh client, then getUpdates until cancelled; a failure of either is
        logged under its own name and retried with the kernel's backoff."""
        bot = self._new_bot(polling=True)
        backoff = Backoff(self._poll_policy)
        timeout = timedelta(seconds=self.config.poll_timeout)
        ready = False
        try:
            while True:
                if self._bus.closed:  # stopping: park until cancelled, fetch nothing more
                    await asyncio.get_running_loop().create_future()
                call = "getUpdates" if ready else "getMe"
                try:
                    if not ready:
                        await bot.initialize()
                        self._me = bot.bot
                        ready = True
                        call = "getUpdates"
                    updates = await bot.get_updates(offset=self._offset, timeout=timeout,
                                                    allowed_updates=ALLOWED_UPDATES)
                except RetryAfter as exc:
                    await asyncio.sleep(backoff.next(retry_seconds(exc)))
                    continue
                except TelegramError as exc:
                    delay = backoff.next()
                    _log.warning("telegram: %s failed (%s: %s); retry in %.1fs", call,
                                 type(exc).__name__, self._redact(exc.message), delay)
                    await asyncio.sleep(delay)
                    continue
                except Exception as exc:  # an answer PTB could not read
                    delay = backoff.next()
                    _log.warning("telegram: %s gave a malformed answer (%s: %s); retry in "
                                 "%.1fs", call, type(exc).__name__, self._redact(str(exc)),
                                 delay)
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                self._live.received()
                self.last_poll_ok = utcnow()
                await self._notify()
                await self._process(updates)
        finally:
            await bot.shutdown()

    async def _process(self, updates: tuple[Update, ...]) -> None:
        """Handle updates in order, advancing the offset past each one handled; while stopping,
        the rest stays unconfirmed for the next start."""
        for update in updates:
            if self._bus.closed or not await self._handle_update(update):
                return
            self._offset = update.update_id + 1

    async def _watchdog(self) -> None:
        interval = min(5.0, self.config.watchdog / 4)
        while True:
            await asyncio.sleep(interval)
            if self._bus.closed:
                continue
            quiet_restart = self._clock() - self._last_restart > self.config.watchdog
            stalled = self._live.stalled() and quiet_restart
            if stalled or self._poller is None or self._poller.done():
                _log.warning("telegram: no getUpdates completed for %.0fs; rebuilding polling",
                             self._live.silent_for() or 0.0)
                await self._restart_polling()

    async def _restart_polling(self) -> None:
        old, self._poller = self._poller, None
        if old is not None:
            old.cancel()
            await asyncio.gather(old, return_exceptions=True)
        self.watchdog_restarts += 1
        self._last_restart = self._clock()  # paces the restarts; health never looks at it
        self._poller = self._tasks.spawn(self._poll(), "telegram-poll")
        await self._notify()

    # --- webhook --------------------------------------------------------------------------------

    async def _start_webhook(self) -> None:
        url = self.config.webhook_url or ""
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post(urlsplit(url).path or "/", self._on_webhook)
        self._runner, self.webhook_port = await listen(
            app, self.config.webhook_listen, self.config.webhook_port,
            what="channels.telegram", error=TelegramChannelError, access_log=None)
        self._tasks.spawn(self._register_webhook(url), "telegram-webhook")

    async def _register_webhook(self, url: str) -> None:
        backoff = Backoff()
        while not self._webhook_ok:
            try:
                await self._bot.set_webhook(url=url, secret_token=self._webhook_secret,
                                            allowed_updates=ALLOWED_UPDATES,
                                            drop_pending_updates=False)
                self._webhook_ok = True
            except Exception as exc:
                delay = backoff.next()
                _log.warning("telegram: setWebhook failed (%s: %s); retry in %.1fs",
                             type(exc).__name__, self._redact(str(exc)), delay)
                await asyncio.sleep(delay)
        await self._notify()

    async def _on_webhook(self, request: web.Request) -> web.Response:
        given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "").encode()
        if not hmac.compare_digest(given, self._webhook_secret.encode()):
            return web.Response(status=401)
        if self._me is None:
            return web.Response(status=503)  # Telegram tries again later
        try:
            update = Update.de_json(await request.json(), self._bot)
        except (ValueError, TypeError, KeyError):
            return web.Response(status=400)
        if update.update_id in self._seen_updates:
            return web.Response()
        if not await self._handle_update(update):
            return web.Response(status=503)
        self._live.received()
        self._seen_updates[update.update_id] = None
        while len(self._seen_updates) > 10_000:
            self._seen_updates.popitem(last=False)
        return web.Response()

    # --- inbound --------------------------------------------------------------------------------

    async def _handle_update(self, update: Update) -> bool:
        """Hand one update to the shared pipeline; False while stopping (not confirmed)."""
        message, me = update.message, self._me
        if message is None or me is None:
            return True
        return await self._inbound.take(self._incoming(message, me),
                                        f"update {update.update_id}")

    async def _incoming(self, message: Message, me: User) -> Incoming | None:
        return incoming(message, bot_id=me.id, bot_username=me.username or "",
                        commands=self._addressed_by)

    # --- outbound -------------------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> Delivery:
        return await self._outbound.send(msg)

    # --- typing ---------------------------------------------------------------------------------

    def activity(self, event: ChatActivity) -> None:
        """While a chat's turn runs, show "typing…" (Telegram shows it for ~5 s per action)."""
        if self._running and event.channel == NAME:
            self._typing.activity(event)

    async def _show_typing(self, place: tuple[str, str | None]) -> float | None:
        chat_id, thread_id = place
        thread = int(thread_id) if thread_id and thread_id.isdigit() else None
        try:
            await self._bot.send_chat_action(chat_id=chat_id, action=ChatAction.TYPING,
                                             message_thread_id=thread)
        except RetryAfter as exc:
            return retry_seconds(exc)
        except TelegramError as exc:
            _log.debug("telegram: typing action failed: %s", self._redact(exc.message))
        return None


def create(deps: ChannelDeps) -> TelegramChannel:
    """The gateway's factory for ``channels.telegram``."""
    return TelegramChannel(deps.config.channels.telegram, bus=deps.bus, store=deps.store,
                           workspace=deps.config.workspace_path, clock=deps.monotonic)
