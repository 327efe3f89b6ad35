"""WebChat: a chat page in the browser, served by the gateway itself (aiohttp).

The page (``webchat_static/``: one HTML file, one script, one stylesheet; no CDN, no build)
keeps a random chat id in local storage; its session is ``webchat:<chat_id>``. Routes:

- ``GET /``, ``/app.js``, ``/style.css``: the page; ``GET /api/info``: limits, token needed?
- ``GET /api/history?chat_id=&after=|before=&limit=``: the chat's log (``webchat_store``).
- ``GET /api/media/<name>?chat_id=``: an image or a recording the chat sent.
- ``GET /api/conversations?profile=``, ``POST /api/conversations``: the browser's past chats,
  listed and registered (``webchat_chats``); ``/vendor/markdown-it.min.js``: the markdown
  parser the page renders with (vendored, MIT).
- ``GET /ws?chat_id=``: the WebSocket; JSON frames both ways (see ``webchat_frames``). To the
  page: ``ready``, ``message`` (a log entry), ``ack`` (a sent message was stored and handed to
  the bus), ``typing``, ``progress``, ``error``, ``pong``.

Every message is logged before it is shown, so a page that was closed or reconnecting gets
everything from history; a sent message is acknowledged only once the bus holds it, and the page
sends unacknowledged messages again after reconnecting (deduplicated by their id). Beyond
loopback a token is required; the WebSocket checks ``Origin``; without a token only loopback
``Host`` names are served (DNS rebinding). The access log is off: no URL reaches a log line.

The WebSocket half (``ChatSockets``: socket auth, frames, the log → publish → ack path) is in
``webchat_sockets``; ``CLOSE_UNAUTHORIZED`` and the socket limits are re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from functools import partial
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from channels.base import ChannelDeps, ChannelStatus, LiveReplies, Shown
from channels.http_api import ApiError, json_errors, listen
from channels.webchat_chats import Conversations
from channels.webchat_frames import (
    AUDIO_TYPES,
    IMAGE_TYPES,
    PARTIAL,
    FrameError,
    check_chat_id,
    host_allowed,
    is_loopback,
    max_frame_bytes,
    partial_frame,
    query_uint,
)
from channels.webchat_sockets import (
    AUTH_TIMEOUT,
    CLOSE_UNAUTHORIZED,
    MAX_QUEUED_FRAMES,
    ChatSockets,
    Socket,
    now_iso,
)
from channels.webchat_store import MEDIA_NAME, LogEntry, WebchatLog, writer
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import WebchatChannelConfig
from gateway.kernel.events import ChatActivity, OutboundMessage
from gateway.kernel.inbox_files import inbox_path
from gateway.kernel.store import Store
from gateway.kernel.store_db import StoreUnavailable
from gateway.kernel.values import ChannelHints, Delivery, OutboxMark, TurnSend

__all__ = [
    "AUTH_TIMEOUT", "CLOSE_UNAUTHORIZED", "MAX_PROGRESS_LINES", "MAX_QUEUED_FRAMES",
    "SECURITY_HEADERS", "STATIC_DIR", "STATIC_FILES", "WebchatChannel", "WebchatError", "create",
]

_log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("webchat_static")
STATIC_FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
                "/style.css": ("style.css", "text/css"),
                "/mic.js": ("mic.js", "text/javascript"),
                "/vendor/markdown-it.min.js": ("vendor/markdown-it.min.js", "text/javascript")}
MAX_PROGRESS_LINES = 20
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; "
                               "media-src 'self' blob: data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class WebchatError(Exception):
    """The channel cannot start (unsafe listen address, port taken)."""


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")


def _answer_text(msg: OutboundMessage) -> str:
    """An answer as the log keeps it: files the agent attached are named, not served."""
    return msg.text + "".join(f"\n\n[attachment: {Path(item.path or item.url or '').name}]"
                              for item in msg.media)


class WebchatChannel(ChatSockets):
    name = "webchat"
    config_model = WebchatChannelConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> WebchatChannel:
        """The ``parley.channels`` entry point's factory (its section: ``channels.webchat``)."""
        return create(deps)

    hints = ChannelHints(
        markup="Markdown (CommonMark with GFM tables): headings, **bold**, *italic*, `code`, "
               "fenced code blocks, lists, > quotes, tables, [links](https://…) and "
               "<https://…>; HTML is shown as plain text",
        max_length=None,
        etiquette="A private chat page in the user's own browser.")
    wants_progress = True

    def __init__(self, config: WebchatChannelConfig, bus: MessageBus, store: Store, *,
                 workspace: Path, earlier_media: Path | None = None) -> None:
        """``workspace``: uploads are saved under its ``inbox/webchat/<chat>/``;
        ``earlier_media``: where earlier versions saved them, still served to their chats."""
        self.config = config
        self._bus = bus
        self._log = WebchatLog(store)
        self._workspace = workspace
        self._earlier_media = earlier_media
        self._max_frame = max_frame_bytes(config.max_text_chars,
                                          max(config.max_image_bytes, config.max_audio_bytes))
        self._chats = Conversations(store, self._authorized,
                                    body_timeout=config.body_timeout)
        self._token = config.token.encode() if config.token else None
        self._static: dict[str, tuple[bytes, str]] = {}
        self._sockets: dict[str, set[Socket]] = {}
        self._chat_locks: dict[str, asyncio.Lock] = {}
        self._busy: dict[str, list[str]] = {}
        self._no_sockets = asyncio.Event()
        self._no_sockets.set()
        self._pushed: dict[str, int] = {}
        """(Several processes) the last answer pushed to each chat's open pages here."""
        self._push_locks: dict[str, asyncio.Lock] = {}
        self._streams: dict[str, str] = {}
        """(Several processes) the live reply this process shows in a chat: its final answer
        replaces it, whichever wake-up pushes that answer first."""
        self._runner: web.AppRunner | None = None
        self._running = False
        self._closing = False
        self.port: int | None = None
        self.base_url: str | None = None
        self.last_inbound_at: str | None = None
        self.last_outbound_at: str | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        host, port = self.config.host, self.config.port
        if self._token is None and not is_loopback(host):  # the config refuses it too
            raise WebchatError(f"channels.webchat.token is required to listen on {host!r}, "
                               "which is not loopback; set a token or use host 127.0.0.1")
        await self._log.ensure_schema()
        await self._chats.ensure_schema()
        self._static = await asyncio.to_thread(self._read_static)
        app = web.Application(middlewares=[json_errors(_log, "webchat", (FrameError,))])
        if self._token is None:
            app.middlewares.append(self._loopback_hosts_only)
        app.on_response_prepare.append(_security_headers)
        for route in STATIC_FILES:
            app.router.add_get(route, self._get_static)
        app.router.add_get("/api/info", self._get_info)
        app.router.add_get("/api/history", self._get_history)
        app.router.add_get("/api/media/{name}", self._get_media)
        app.router.add_get("/ws", self._websocket)
        self._chats.add_routes(app)
        # No access log: it prints every URL, and a URL is the one place a careless client
        # might put the token.
        self._runner, self.port = await listen(app, host, port, what="channels.webchat",
                                               error=WebchatError, access_log=None,
                                               shutdown_timeout=2.0)
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        self._closing = False
        self._running = True
        _log.info("webchat page at %s", self.base_url)

    @staticmethod
    def _read_static() -> dict[str, tuple[bytes, str]]:
        return {route: ((STATIC_DIR / file).read_bytes(), mime)
                for route, (file, mime) in STATIC_FILES.items()}

    async def stop(self) -> None:
        """Close every socket (the pages reconnect to the next gateway), then the server."""
        self._closing = True
        for sockets in list(self._sockets.values()):
            for sock in sockets:
                sock.close()
        try:
            await asyncio.wait_for(self._no_sockets.wait(), 5.0)
        except TimeoutError:
            _log.warning("webchat: sockets still open at shutdown")
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._running = False

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=self._running and not self._closing, detail={
            "url": self.base_url,
            "sockets": sum(len(s) for s in self._sockets.values()),
            "chats_connected": len(self._sockets),
            "token_required": self._token is not None,
            "last_inbound_at": self.last_inbound_at,
            "last_outbound_at": self.last_outbound_at,
        })

    # --- outbound ---------------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> Delivery:
        return await self.send_marked(msg, None)

    async def send_marked(self, msg: OutboundMessage, mark: OutboxMark | None) -> Delivery:
        """Log the message (the durable record the page reads; ``mark``: its outbox row marked
        delivered in the same write), then push it to open pages."""
        if msg.kind == "progress":  # shown under "working…", never kept
            lines = self._busy.get(msg.chat_id)
            if lines is not None:
                lines.append(msg.text)
                del lines[:-MAX_PROGRESS_LINES]
                self._broadcast(msg.chat_id, {"type": "progress", "text": msg.text})
            return Delivery(ok=True)
        try:
            entry, new = await self._log.add(
                chat_id=msg.chat_id, role="assistant", kind=msg.kind, text=_answer_text(msg),
                key=msg.idempotency_key, reply_to=msg.reply_to, created_at=msg.created_at,
                mark=mark)
        except (sqlite3.Error, StoreUnavailable) as exc:
            return Delivery(ok=False, error=f"webchat log: {exc}")
        if new and self._log.shared:  # in seq order with the other processes' answers
            self.last_outbound_at = now_iso()
            await self._push_answers(msg.chat_id, {entry.seq: msg.stream})
            new = False
        return self._sent(msg, (entry, new), recorded=mark is not None)

    def send_with_turn(self, msg: OutboundMessage) -> TurnSend | None:
        """``msg`` logged inside its turn's transaction (``TurnSend``), or None: sent the
        usual way (a progress line, several processes, stopping)."""
        if msg.kind == "progress" or self._log.shared or not self._running or self._closing:
            return None
        write = writer(chat_id=msg.chat_id, role="assistant", kind=msg.kind,
                       text=_answer_text(msg), key=msg.idempotency_key, reply_to=msg.reply_to,
                       created_at=msg.created_at)
        return TurnSend(msg.idempotency_key, write, partial(self._sent, msg, recorded=True))

    def _sent(self, msg: OutboundMessage, logged: tuple[LogEntry, bool], *,
              recorded: bool) -> Delivery:
        """An answer logged (``new``: just now): pushed to the chat's open pages."""
        entry, new = logged
        if new:
            self.last_outbound_at = now_iso()
            self._push_answer(entry, msg.stream)
        return Delivery(ok=True, message_ids=(str(entry.seq),), recorded=recorded)

    def _push_answer(self, entry: LogEntry, stream: str | None) -> None:
        frame = {"type": "message", "message": entry.to_json()}
        if stream is not None:  # it replaces the partial the page shows
            frame["stream"] = stream
        self._broadcast(entry.chat_id, frame)

    async def answers_elsewhere(self, chat_id: str) -> None:
        """(Several processes on PostgreSQL.) A process stored an answer to ``chat_id``
        (``NOTIFY parley_webchat``): pushed to this process's open pages of that chat."""
        await self._push_answers(chat_id, {})

    async def _push_answers(self, chat_id: str, streams: dict[int, str | None]) -> None:
        """The chat's answers past the last one pushed here, in ``seq`` order, to its open
        pages (``streams``: the partial an answer written here replaces)."""
        lock = self._push_locks.setdefault(chat_id, asyncio.Lock())
        async with lock:  # one reader per chat at a time: each answer pushed once
            pushed = self._pushed.get(chat_id)
            if pushed is None:  # no page open here
                self._push_locks.pop(chat_id, None)
                return
            for entry in await self._log.answers_after(chat_id, pushed):
                self._push_answer(entry, self._streams.pop(chat_id, None)
                                  or streams.get(entry.seq))
                pushed = entry.seq
            if chat_id in self._pushed:
                self._pushed[chat_id] = max(self._pushed[chat_id], pushed)

    # --- live replies (``channels.webchat.streaming``) ----------------------------------------

    @property
    def live(self) -> LiveReplies:
        return self

    async def show(self, target: OutboundMessage, text: str,
                   message_id: str | None) -> Shown:
        """The answer so far to the open pages (``partial``: the whole text each time); the
        final ``message`` frame names the same ``stream`` and replaces it."""
        if self._log.shared and target.stream is not None:
            self._streams[target.chat_id] = target.stream
        self._broadcast(target.chat_id, partial_frame(target.stream or "", text))
        return Shown(message_id=PARTIAL)

    async def finish(self, msg: OutboundMessage, message_id: str) -> Delivery:
        return await self.send(msg)

    async def remove(self, target: OutboundMessage, message_id: str) -> None:
        self._streams.pop(target.chat_id, None)
        self._broadcast(target.chat_id, {"type": "partial_end", "stream": target.stream})

    def activity(self, event: ChatActivity) -> None:
        """A turn started or ended: the page shows "working…" (and progress lines) meanwhile."""
        if event.busy:
            self._busy[event.chat_id] = []
        else:
            self._busy.pop(event.chat_id, None)
        self._broadcast(event.chat_id, {"type": "typing", "busy": event.busy})

    # --- HTTP -------------------------------------------------------------------------------

    @web.middleware
    async def _loopback_hosts_only(self, request: web.Request,
                                   handler: Handler) -> web.StreamResponse:
        if not host_allowed(request.host, allowed_origins=self.config.allowed_origins):
            raise ApiError("host: only loopback names are served without "
                           "channels.webchat.token", 403)
        return await handler(request)

    def _require_token(self, request: web.Request) -> None:
        if not self._authorized(request):
            raise ApiError("authorization: missing or wrong token", 401)

    async def _get_static(self, request: web.Request) -> web.Response:
        body, mime = self._static[request.path]
        return web.Response(body=body, content_type=mime, charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    async def _get_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "token_required": self._token is not None,
            "max_text_chars": self.config.max_text_chars,
            "max_image_bytes": self.config.max_image_bytes,
            "max_frame_bytes": self._max_frame,
            "image_types": list(IMAGE_TYPES),
            "max_audio_bytes": self.config.max_audio_bytes,
            "audio_types": list(AUDIO_TYPES),
        })

    async def _get_history(self, request: web.Request) -> web.Response:
        self._require_token(request)
        query = request.query
        chat_id = check_chat_id(query.get("chat_id"))
        after, before = query_uint(query, "after"), query_uint(query, "before")
        if after is not None and before is not None:
            raise ApiError("before: cannot be combined with after")
        limit = query_uint(query, "limit") or self.config.history_limit
        entries, more = await self._log.history(
            chat_id, after=after, before=before, limit=min(limit, self.config.history_limit))
        last = entries[-1].seq if entries else (after or 0)
        return web.json_response({"messages": [e.to_json() for e in entries], "next": last,
                                  "more": more, "busy": chat_id in self._busy})

    async def _get_media(self, request: web.Request) -> web.StreamResponse:
        self._require_token(request)
        chat_id = check_chat_id(request.query.get("chat_id"))
        name = request.match_info["name"]
        image = await self._log.image_of(chat_id, name) if MEDIA_NAME.fullmatch(name) else None
        folders = (inbox_path(self._workspace, self.name, chat_id), self._earlier_media)
        path = None
        for folder in folders if image is not None else ():
            if folder is not None and await asyncio.to_thread((folder / name).is_file):
                path = folder / name
                break
        if image is None or path is None:
            raise ApiError("name: no such file in this chat", 404)
        return web.FileResponse(path, headers={"Content-Type": image["mime"],
                                               "Cache-Control": "private, max-age=86400"})


def create(deps: ChannelDeps) -> WebchatChannel:
    """The gateway's factory for ``channels.webchat``."""
    return WebchatChannel(deps.config.channels.webchat, deps.bus, deps.store,
                          workspace=deps.config.workspace_path,
                          earlier_media=deps.data_path / "media" / "webchat")

