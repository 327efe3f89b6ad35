"""The local channel: a fake chat platform for tests, the terminal and scripts.

In-process: ``inject``, ``wait_messages``, ``ask``. Over HTTP: ``POST /v1/messages`` → 202,
``GET /v1/messages?chat_id=&after=&wait=`` (long poll, ``wait`` capped at 60 s) and
``GET /v1/health``. A client may send its own ``message_id`` so that a retried POST is taken
once (``"duplicate": true`` in the answer). Every error is JSON ``{"error": "<field>: ..."}``:
400 for a bad field (a lone surrogate in any text included); 408 for a body not received
within ``body_timeout``; 413 for oversize input (``text`` over ``max_text_chars``, ``media[i]``
over ``max_media_bytes``, ``body`` over what those allow); 401 for a missing or wrong bearer
token; 503 while the bus is closed or the message could not be stored (never a 202 for a
message a restart would not find). A client that disconnects is a debug line. Replies are
numbered by ``seq``, kept in the database (``local_log``) when the gateway gives the channel
its store: monotonic across restarts, and replies not yet read survive them. Without a token
the server only listens on loopback, because ``{"path"}`` media lets a caller hand the agent
any file the gateway can read.

The request contract (field checks, media specs, the bearer token) is in ``local_requests``,
re-exported here; the server is ``http_serve``; the reply log ``local_log``.
Longer than 450 lines: the in-process API, the HTTP handlers and live replies share one window.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import sqlite3
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from channels.base import ChannelBase, ChannelDeps, ChannelStatus, LiveReplies, Shown
from channels.http_api import ApiError
from channels.http_serve import Limits, Reply, Request, Server
from channels.local_log import ReplyLog, final_extra, reply_record
from channels.local_requests import (
    CHANNEL_NAME,
    MAX_ID_CHARS,
    MAX_MEDIA_ITEMS,
    MAX_WAIT_SECONDS,
    InlineMedia,
    PathMedia,
    Spec,
    is_loopback,
    make_inbound,
    max_body_bytes,
    media_kind,
    parse_poll_query,
    parse_post_body,
    store_media,
    validate_post,
)
from gateway.kernel.bus import BusClosed, MessageBus, NotStored
from gateway.kernel.config import LocalChannelConfig
from gateway.kernel.events import ChatType, InboundMessage, Media, OutboundMessage, Trust
from gateway.kernel.inbox_files import inbox_path
from gateway.kernel.store_db import Database, StoreUnavailable
from gateway.kernel.values import ChannelHints, Delivery, OutboxMark, TurnSend

__all__ = [
    "ANSWER_KINDS", "MAX_CHATS", "MAX_IDEMPOTENCY_KEYS", "MAX_ID_CHARS", "MAX_MEDIA_ITEMS",
    "MAX_RECORDS", "MAX_RECORDS_PER_CHAT", "MAX_WAIT_SECONDS", "InlineMedia", "LocalChannel",
    "LocalChannelError", "PathMedia", "Spec", "create", "is_loopback", "make_inbound",
    "max_body_bytes", "media_kind", "parse_poll_query", "parse_post_body", "store_media",
    "validate_post",
]

_log = logging.getLogger(__name__)

MAX_RECORDS_PER_CHAT = 1000
MAX_CHATS = 1000
MAX_RECORDS = 5000
"""Records kept in all (oldest chats' first out): clients read replies as they come, so memory
stays bounded however many sessions the gateway serves."""
MAX_IDEMPOTENCY_KEYS = 5000
ANSWER_KINDS = frozenset({"reply", "error", "notice"})


class _Poll:
    """A long poll's wake-up: a future that a reply (``_wake``), the channel stopping, or the
    poll's deadline settles. Lighter than an ``asyncio.Event`` under ``asyncio.timeout`` (two
    objects, a loop lookup and the task's cancel bookkeeping each wait), which every turn's
    ``GET`` paid (issue 24)."""

    __slots__ = ("future", "woken")

    def __init__(self) -> None:
        self.future: asyncio.Future[None] | None = None
        self.woken = False

    def set(self) -> None:
        self.woken = True
        if self.future is not None and not self.future.done():
            self.future.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Until ``set`` (or a ``set`` since the last wait) or ``deadline``."""
        if self.woken:
            self.woken = False
            return
        future = self.future = loop.create_future()
        timer = loop.call_at(deadline, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
            self.future = None
            self.woken = False


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LocalChannelError(Exception):
    """The local channel cannot do what was asked (unsafe listen address, stopped channel)."""


class LocalChannel(ChannelBase):
    name = CHANNEL_NAME
    config_model = LocalChannelConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> LocalChannel:
        """The ``parley.channels`` entry point's factory (its section: ``channels.local``)."""
        return create(deps)

    hints = ChannelHints(markup="Markdown (shown as plain text)", max_length=None,
                         etiquette="A test channel; answer as you would in a normal chat.")

    def __init__(self, config: LocalChannelConfig, bus: MessageBus, *, workspace: Path,
                 health: Callable[[], dict[str, Any]] | None = None,
                 serve_http: bool = True, store: Database | None = None) -> None:
        """``store``: where replies are kept (``local_log``), so ``seq`` goes on across
        restarts; without it they live in memory only."""
        self.config = config
        self._replies = ReplyLog(store) if store is not None else None
        self._partials = 0
        self._bus = bus
        self._workspace = workspace
        """Uploaded files go to its ``inbox/local/<chat>/``."""
        self._health = health or dict
        self._serve_http = serve_http
        self._max_body = max_body_bytes(config.max_text_chars, config.max_media_bytes)
        self._records: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._deliveries: OrderedDict[str, Delivery] = OrderedDict()
        self._seq = 0
        self._stored = 0
        self._waiters: dict[str, set[_Poll]] = {}
        """Long polls waiting per chat: a reply wakes only its own chat's pollers."""
        self._running = False
        self._closing = False
        self._server: Server | None = None
        self._routes: dict[str, dict[str, Callable[[Request], Any]]] = {
            "/v1/messages": {"POST": self._post_message, "GET": self._get_messages,
                             "HEAD": self._get_messages},
            "/v1/health": {"GET": self._get_health, "HEAD": self._get_health}}
        self._token = f"Bearer {config.token}".encode() if config.token else None
        self.port: int | None = None
        self.base_url: str | None = None

    async def start(self) -> None:
        if self._running:
            return
        self._closing = False
        if self._replies is not None:
            await self._replies.setup()
            for record in await self._replies.load(MAX_RECORDS):
                self._remember(record)
            self._seq = max(self._seq, await self._replies.last_seq())
        if self._serve_http:
            await self._start_http()
        self._running = True

    async def _start_http(self) -> None:
        host, port = self.config.host, self.config.port
        if not self.config.token and not is_loopback(host):
            raise LocalChannelError(
                f"channels.local: refusing to listen on {host!r} without a token; "
                "set channels.local.token or listen on 127.0.0.1")
        self._server = Server(self._handle, admit=self._admit, refuse=_error, log=_log,
                              what="local channel",
                              limits=Limits(self._max_body, self.config.body_timeout,
                                            "channels.local.body_timeout"))
        try:
            self.port = await self._server.listen(host, port)
        except OSError as exc:
            self._server = None
            raise LocalChannelError(
                f"channels.local: cannot listen on {host}:{port}: {exc}") from exc
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        _log.info("local channel listening on %s", self.base_url)

    # --- live replies: ``partial`` records (``channels.local.streaming``) ---------------------

    @property
    def live(self) -> LiveReplies | None:  # type: ignore[override]
        return self

    async def show(self, target: OutboundMessage, text: str,
                   message_id: str | None) -> Shown:
        """The answer so far as a ``partial`` record (the whole text each time); the
        final ``reply`` record carries the same ``stream`` key and ``"final": true``."""
        self._partials += 1  # each partial its own record (and seq), stored like a reply so
        # that ``seq`` stays one durable sequence a client can follow across restarts
        done = await self._append(target, text, "partial", {"stream": target.stream,
                                                            "final": False},
                                  f"{target.idempotency_key}#partial{self._partials}")
        return Shown(error=done.error) if isinstance(done, Delivery) else Shown()

    async def finish(self, msg: OutboundMessage, message_id: str) -> Delivery:
        return await self.send(msg)

    async def remove(self, target: OutboundMessage, message_id: str) -> None:
        return None

    async def stop(self) -> None:
        """Wake every long poll first, so the server's shutdown does not wait for them."""
        self._closing = True
        for polls in self._waiters.values():
            for poll in polls:
                poll.set()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(5.0)
        self._running = False

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=self._running and not self._closing,
                             detail={"url": self.base_url, "stored": self._stored})

    async def send(self, msg: OutboundMessage) -> Delivery:
        return await self.send_marked(msg, None)

    async def send_marked(self, msg: OutboundMessage, mark: OutboxMark | None) -> Delivery:
        """``send``, the outbox row marked delivered (``mark``) in the reply log's write when
        there is one (``Delivery.recorded``): the delivery worker's own write is saved."""
        known = self._deliveries.get(msg.idempotency_key)
        if known is not None:
            return known
        seq = await self._append(msg, msg.text, msg.kind, final_extra(msg), msg.idempotency_key,
                                 mark)
        if isinstance(seq, Delivery):
            return seq
        return self._delivered(msg.idempotency_key, seq, mark is not None and
                               self._replies is not None)

    def send_with_turn(self, msg: OutboundMessage) -> TurnSend | None:
        """``msg`` written to the reply log inside its turn's transaction (``TurnSend``), or
        None: sent the usual way (no reply log, several processes, sent before, stopping)."""
        replies = self._replies
        if (replies is None or replies.shared or not self._running or self._closing
                or msg.idempotency_key in self._deliveries):
            return None
        record = reply_record(msg, msg.text, msg.kind, final_extra(msg))
        return TurnSend(msg.idempotency_key, replies.writer(msg.idempotency_key, record),
                        partial(self._sent_with_turn, msg, record))

    def _sent_with_turn(self, msg: OutboundMessage, record: dict[str, Any],
                        stored: tuple[int, bool]) -> Delivery:
        seq, new = stored
        if new:
            self._remember({"seq": seq, **record})
        self._wake(msg.chat_id)
        return self._delivered(msg.idempotency_key, seq, True)

    def _delivered(self, key: str, seq: int, recorded: bool) -> Delivery:
        """Sent as ``seq``: a repeat of ``key`` is not stored again (and answers the delivery
        without ``recorded``: its outbox row was not marked by that repeat)."""
        ids = (str(seq),)
        delivery = self._deliveries[key] = Delivery(ok=True, message_ids=ids)
        while len(self._deliveries) > MAX_IDEMPOTENCY_KEYS:
            self._deliveries.popitem(last=False)
        return Delivery(ok=True, message_ids=ids, recorded=True) if recorded else delivery

    async def _append(self, msg: OutboundMessage, text: str, kind: str,
                      extra: dict[str, Any], key: str,
                      mark: OutboxMark | None = None) -> int | Delivery:
        """A record for ``msg``'s chat (stored first, once per ``key``, when the channel
        has a reply log, with ``mark`` in the same write), woken pollers; its ``seq``, or
        the failed delivery."""
        record = reply_record(msg, text, kind, extra)
        if self._replies is None:
            self._seq += 1
            seq, new = self._seq, True
        else:  # stored first: a reply the log could not keep is not delivered (retried)
            try:
                seq, new = await self._replies.add(key, record, mark)
                if self._replies.shared:  # with the other processes' before it, in order
                    await self._sync(msg.chat_id)
                    return seq
            except (sqlite3.Error, StoreUnavailable) as exc:
                return Delivery(ok=False, error=f"local reply log: {exc}")
        if new:
            self._remember({"seq": seq, **record})
        self._wake(msg.chat_id)
        return seq

    def _wake(self, chat_id: str) -> None:
        for poll in self._waiters.get(chat_id, ()):
            poll.set()

    async def replies_elsewhere(self, chat_id: str) -> None:
        """(Several processes on PostgreSQL.) Another process stored a reply to ``chat_id``
        (``NOTIFY parley_local``): read it when someone here waits for that chat; a later
        read (``wait_messages``) reads it anyway."""
        if chat_id in self._waiters:
            await self._sync(chat_id)

    async def _sync(self, chat_id: str) -> None:
        """The chat's stored replies past the newest in this process's window, whichever
        process wrote them. Replies commit in ``seq`` order (``local_log``), so the window
        never skips one a client could then pass by with ``after``."""
        assert self._replies is not None
        rows = await self._replies.newer(chat_id, self._last_seq(chat_id), MAX_RECORDS_PER_CHAT)
        known = {r["seq"] for r in self._records.get(chat_id, ())}
        for row in rows:
            if row["seq"] not in known:  # two syncs at once read the same rows
                self._remember(row)
        if rows:
            self._wake(chat_id)

    def _remember(self, record: dict[str, Any]) -> None:
        """Keep ``record`` in its chat's window, in ``seq`` order."""
        seq, chat_id = record["seq"], record["chat_id"]
        self._seq = max(self._seq, seq)
        records = self._records.get(chat_id)
        if records is None:
            records = self._records[chat_id] = deque(maxlen=MAX_RECORDS_PER_CHAT)
        else:
            self._records.move_to_end(chat_id)
        self._stored += 1 - (len(records) == records.maxlen)
        records.append(record)
        if len(records) > 1 and records[-2]["seq"] > seq:  # two sends to one chat at once
            ordered = sorted(records, key=lambda r: r["seq"])
            records.clear()
            records.extend(ordered)
        self._prune()

    def _prune(self) -> None:
        """Drop the least recently active chats' oldest records past the limits."""
        while len(self._records) > MAX_CHATS or self._stored > MAX_RECORDS:
            chat_id, oldest = next(iter(self._records.items()))
            oldest.popleft()
            self._stored -= 1
            if not oldest:
                del self._records[chat_id]

    # --- in-process API -----------------------------------------------------------------------

    async def inject(self, chat_id: str, text: str, *, sender_id: str = "u1",
                     sender_name: str | None = None, chat_type: ChatType = "direct",
                     mentioned: bool = False, thread_id: str | None = None,
                     media: Iterable[Media] = (), trust: Trust = "owner") -> InboundMessage:
        msg = make_inbound(chat_id, text, sender_id=sender_id, sender_name=sender_name,
                           media=tuple(media), thread_id=thread_id, chat_type=chat_type,
                           mentioned=mentioned, trust=trust)
        await self._bus.publish_inbound(msg)
        return msg

    async def wait_messages(self, chat_id: str, *, after: int = 0,
                            timeout: float = 10.0,  # noqa: ASYNC109 - the contract's name
                            ) -> tuple[list[dict[str, Any]], int]:
        """Records of ``chat_id`` newer than ``after``, waiting up to ``timeout`` for one.
        With several processes, what the others stored is read first (the waiter is there
        before: a reply stored meanwhile wakes it)."""
        shared = self._replies is not None and self._replies.shared
        if shared or (timeout > 0 and not self._closing and self._last_seq(chat_id) <= after):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(timeout, 0)
            poll = _Poll()
            waiters = self._waiters.setdefault(chat_id, set())
            waiters.add(poll)
            try:
                if shared:
                    await self._sync(chat_id)
                while (not self._closing and self._last_seq(chat_id) <= after
                       and loop.time() < deadline):
                    await poll.wait(loop, deadline)
            finally:
                waiters.discard(poll)
                if not waiters:
                    self._waiters.pop(chat_id, None)
        newer: list[dict[str, Any]] = []
        for record in reversed(self._records.get(chat_id, ())):  # newest first: O(new ones)
            if record["seq"] <= after:
                break
            newer.append(record)
        found = [{**r, "media": [dict(m) for m in r["media"]]} for r in reversed(newer)]
        return found, (found[-1]["seq"] if found else after)

    def _last_seq(self, chat_id: str) -> int:
        records = self._records.get(chat_id)
        return records[-1]["seq"] if records else 0

    async def ask(self, chat_id: str, text: str, *,
                  timeout: float = 30.0, **kw: Any) -> str:  # noqa: ASYNC109
        """Inject ``text`` and return the first reply, error or notice the chat gets after it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        after = self._seq
        await self.inject(chat_id, text, **kw)
        while (remaining := deadline - loop.time()) > 0:
            found, after = await self.wait_messages(chat_id, after=after, timeout=remaining)
            for record in found:
                if record["kind"] in ANSWER_KINDS:
                    return str(record["text"])
            if self._closing:
                raise LocalChannelError("the local channel stopped before an answer came")
        raise TimeoutError(f"no answer in chat {chat_id!r} within {timeout:g} s")

    # --- HTTP handlers (``channels/http_serve.py`` reads and writes the bytes) ----------------

    def _admit(self, request: Request) -> Reply | None:
        """From the head alone: the token first (nothing about the routes is told without
        it), then the route and the method. A refused request's body is never read."""
        if self._token is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode("latin-1"), self._token):
            return _error(401, "authorization: missing or wrong bearer token")
        methods = self._routes.get(request.path)
        if methods is None:
            return _error(404, "not found")
        if request.method not in methods:
            return _error(405, "method not allowed", (("Allow", ", ".join(methods)),))
        return None

    async def _handle(self, request: Request) -> Reply:
        try:
            return await self._routes[request.path][request.method](request)  # type: ignore[no-any-return]
        except ApiError as exc:
            return _error(exc.status, exc.message)

    async def _post_message(self, request: Request) -> Reply:
        limit = self.config.max_media_bytes
        msg, specs = parse_post_body(request.body, max_text_chars=self.config.max_text_chars,
                                     max_media_bytes=limit)
        if self._closing or self._bus.closed:
            raise ApiError("gateway is shutting down", 503)
        if specs:
            folder = inbox_path(self._workspace, self.name, msg.chat_id)
            media = await asyncio.to_thread(store_media, specs, folder, limit)
            msg = replace(msg, media=media)
        try:
            new = await self._bus.publish_inbound(msg)
        except BusClosed:
            raise ApiError("gateway is shutting down", 503) from None
        except NotStored as exc:  # never 202 for what a restart would not find
            _log.warning("local channel: refused message %s: %s", msg.message_id, exc)
            raise ApiError(f"store: {exc}; nothing was taken, send it again later",
                           503) from None
        body: dict[str, Any] = {"message_id": msg.message_id}
        if not new:
            body["duplicate"] = True  # a retry of a message already taken: not answered twice
        return Reply(202, orjson.dumps(body))

    async def _get_messages(self, request: Request) -> Reply:
        chat_id, after, wait = parse_poll_query(request.query)
        found, next_seq = await self.wait_messages(chat_id, after=after, timeout=wait)
        return Reply(200, _dumps({"messages": found, "next": next_seq}))

    async def _get_health(self, request: Request) -> Reply:
        data: dict[str, Any] = {"status": "ok", **self._health()}
        channels = data.setdefault("channels", {})
        if isinstance(channels, dict) and self.name not in channels:
            status = self.status()
            channels[self.name] = {"running": status.running, **status.detail}
        return Reply(200, json.dumps(data, default=str).encode())


def _dumps(data: Any) -> bytes:
    """orjson, or ``json`` for what orjson refuses (an int beyond 64 bits in a record)."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    if status == 401:
        headers = (*headers, ("WWW-Authenticate", "Bearer"))
    return Reply(status, _dumps({"error": message}), headers=headers)


def create(deps: ChannelDeps) -> LocalChannel:
    """The gateway's factory for ``channels.local``."""
    return LocalChannel(deps.config.channels.local, deps.bus,
                        workspace=deps.config.workspace_path, health=deps.health,
                        store=deps.store)
