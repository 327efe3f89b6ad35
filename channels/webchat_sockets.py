"""The WebSocket half of ``WebchatChannel``: one open page's socket, its token check, the
frames it sends (a message is logged, published, then acknowledged) and the frames pushed to it.

Separate from ``webchat.py`` (lifecycle, outbound, the HTTP routes) so the delivery
guarantees of one chat's sockets read on their own. ``ChatSockets`` is a mixin of
``WebchatChannel``: the attributes annotated on it are the channel state this half shares,
all set in ``WebchatChannel.__init__``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from channels.http_api import ApiError
from channels.webchat_frames import (
    FrameError,
    ImageData,
    check_chat_id,
    origin_allowed,
    parse_frame,
    parse_message,
)
from channels.webchat_store import LogEntry, WebchatLog, is_audio, save_image, user_key
from gateway.kernel.bus import BusClosed, MessageBus, NotStored
from gateway.kernel.config import WebchatChannelConfig
from gateway.kernel.events import InboundKind, InboundMessage, Media
from gateway.kernel.inbox_files import inbox_path
from gateway.kernel.store_db import StoreUnavailable

_log = logging.getLogger(__name__)

AUTH_TIMEOUT = 10.0
"""Seconds a socket has to send its ``auth`` frame."""
MAX_QUEUED_FRAMES = 500
"""A socket this far behind is closed; the page reconnects and reads on from history."""
CLOSE_UNAUTHORIZED = 4401
"""Close code telling the page to ask for the token again."""


@dataclass(eq=False)
class Socket:
    """One open WebSocket. Frames go through a queue drained by one writer, so frames reach the
    page in the order they were produced, and sync callers (``activity``) never wait."""

    ws: web.WebSocketResponse
    chat_id: str
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    closing: bool = False

    def push(self, frame: dict[str, Any]) -> None:
        if self.closing:
            return
        if self.queue.qsize() >= MAX_QUEUED_FRAMES:
            _log.warning("webchat: a socket of chat %s fell behind; closing it", self.chat_id)
            self.close()
            return
        self.queue.put_nowait(frame)

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.queue.put_nowait(None)


def now_iso() -> str:
    """Now, as the status shows it (``last_inbound_at``, ``last_outbound_at``)."""
    return datetime.now(UTC).isoformat()


class ChatSockets:
    """The open sockets of every chat, and what is said over them."""

    name: str
    config: WebchatChannelConfig
    _bus: MessageBus
    _log: WebchatLog
    _workspace: Path
    _max_frame: int
    _token: bytes | None
    _sockets: dict[str, set[Socket]]
    _chat_locks: dict[str, asyncio.Lock]
    _busy: dict[str, list[str]]
    _no_sockets: asyncio.Event
    _closing: bool
    _pushed: dict[str, int]
    last_inbound_at: str | None

    def _broadcast(self, chat_id: str, frame: dict[str, Any]) -> None:
        for sock in list(self._sockets.get(chat_id, ())):
            sock.push(frame)

    def _authorized(self, request: web.Request) -> bool:
        """The request carries ``Authorization: Bearer <token>`` (or no token is set)."""
        if self._token is None:
            return True
        given = request.headers.get("Authorization", "").encode("utf-8", "backslashreplace")
        return hmac.compare_digest(given, b"Bearer " + self._token)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        chat_id = check_chat_id(request.query.get("chat_id"))
        if not origin_allowed(request.headers.get("Origin"), scheme=request.scheme,
                              host_header=request.host,
                              allowed=self.config.allowed_origins):
            _log.warning("webchat: refused a socket from origin %r",
                         request.headers.get("Origin"))
            raise ApiError("origin: this page's origin may not open the chat socket", 403)
        if self._closing:
            raise ApiError("gateway is shutting down", 503)
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=self._max_frame)
        await ws.prepare(request)
        if not self._authorized(request) and not await self._socket_auth(ws):
            _log.warning("webchat: refused a socket with a missing or wrong token from %s",
                         request.remote)
            await ws.send_json(FrameError("token: missing or wrong").frame())
            await ws.close(code=CLOSE_UNAUTHORIZED, message=b"token required")
            return ws
        if self._closing:  # stopped while this socket was authenticating
            await ws.close(code=WSCloseCode.GOING_AWAY)
            return ws
        if self._log.shared and chat_id not in self._sockets:  # answers after this one: pushed
            self._pushed[chat_id] = await self._log.last_seq(chat_id)
        sock = Socket(ws, chat_id)
        self._sockets.setdefault(chat_id, set()).add(sock)
        self._no_sockets.clear()
        writer = asyncio.create_task(self._write(sock), name=f"webchat-writer:{chat_id}")
        try:
            sock.push({"type": "ready", "chat_id": chat_id, "busy": chat_id in self._busy,
                       "progress": list(self._busy.get(chat_id, ()))})
            async for frame in ws:
                if frame.type == WSMsgType.TEXT:
                    await self._on_frame(sock, frame.data)
                elif frame.type == WSMsgType.BINARY:
                    sock.push(FrameError("frame: must be JSON text").frame())
        finally:
            sock.close()
            await asyncio.gather(writer, return_exceptions=True)
            self._forget(sock)
        return ws

    async def _socket_auth(self, ws: web.WebSocketResponse) -> bool:
        """The page's first frame is ``{"type": "auth", "token"}`` (never part of the URL)."""
        assert self._token is not None
        try:
            frame = await ws.receive(timeout=AUTH_TIMEOUT)
        except TimeoutError:
            return False
        if frame.type != WSMsgType.TEXT:
            return False
        try:
            data = json.loads(frame.data)
        except ValueError:
            return False
        token = data.get("token") if isinstance(data, dict) and data.get("type") == "auth" \
            else None
        return isinstance(token, str) and hmac.compare_digest(
            token.encode("utf-8", "backslashreplace"), self._token)

    async def _write(self, sock: Socket) -> None:
        try:
            while (frame := await sock.queue.get()) is not None:
                await sock.ws.send_json(frame)
        except (ConnectionError, RuntimeError):
            pass  # the page went away; it reads on from history when it comes back
        finally:
            sock.closing = True
            code = WSCloseCode.GOING_AWAY if self._closing else WSCloseCode.TRY_AGAIN_LATER
            await sock.ws.close(code=code)

    def _forget(self, sock: Socket) -> None:
        sockets = self._sockets.get(sock.chat_id)
        if sockets is not None:
            sockets.discard(sock)
            if not sockets:
                del self._sockets[sock.chat_id]
                self._pushed.pop(sock.chat_id, None)
                lock = self._chat_locks.get(sock.chat_id)
                if lock is not None and not lock.locked():
                    del self._chat_locks[sock.chat_id]
        if not self._sockets:
            self._no_sockets.set()

    async def _on_frame(self, sock: Socket, raw: str) -> None:
        data: dict[str, Any] = {}
        try:
            data = parse_frame(raw)
            kind = data["type"]
            if kind == "message":
                msg = parse_message(data, chat_id=sock.chat_id,
                                    max_text_chars=self.config.max_text_chars,
                                    max_image_bytes=self.config.max_image_bytes,
                                    max_audio_bytes=self.config.max_audio_bytes)
                lock = self._chat_locks.setdefault(sock.chat_id, asyncio.Lock())
                async with lock:  # two tabs resending one message publish it once
                    await self._accept(sock, msg.chat_id, msg.message_id, msg.text,
                                       msg.image or msg.audio)
            elif kind == "ping":
                sock.push({"type": "pong"})
            elif kind != "auth":  # a second auth frame (header already did it) is harmless
                raise FrameError(f"type: unknown frame type {kind!r}")
        except FrameError as exc:
            sock.push(exc.frame())
        except (asyncio.CancelledError, ConnectionError):
            raise
        except (NotStored, StoreUnavailable) as exc:  # not acknowledged: the page keeps it
            _log.warning("webchat: a message of chat %s was not stored: %s", sock.chat_id, exc)
            sock.push(FrameError(f"store: the gateway cannot store messages right now ({exc}); "
                                 "the message is sent again after reconnecting",
                                 message_id=_message_id(data), retry=True).frame())
        except Exception:
            _log.exception("webchat: a frame of chat %s failed", sock.chat_id)
            sock.push(FrameError("internal error; the message is sent again after reconnecting",
                                 message_id=_message_id(data), retry=True).frame())

    async def _accept(self, sock: Socket, chat_id: str, message_id: str, text: str,
                      image: ImageData | None) -> None:
        """Log → publish → mark accepted → ack. A message logged but not yet accepted (the bus
        closed under it) is published again when the page resends it."""
        key = user_key(chat_id, message_id)
        entry = await self._log.find(key)
        if entry is not None and entry.accepted:
            sock.push({"type": "ack", "message_id": message_id, "seq": entry.seq,
                       "duplicate": True})
            return
        if self._closing or self._bus.closed:
            raise FrameError("gateway is restarting; the message is sent again after it",
                             message_id=message_id, retry=True)
        if entry is None:
            saved = await asyncio.to_thread(save_image, image, self._inbox(chat_id)) \
                if image else None
            entry, _ = await self._log.add(
                chat_id=chat_id, role="user", kind=_inbound_kind(text), text=text, key=key,
                image=saved, message_id=message_id, accepted=False)
        try:
            await self._bus.publish_inbound(self._inbound(entry))
        except BusClosed:
            raise FrameError("gateway is restarting; the message is sent again after it",
                             message_id=message_id, retry=True) from None
        await self._log.mark_accepted(entry.seq)
        entry = replace(entry, accepted=True)
        self.last_inbound_at = now_iso()
        sock.push({"type": "ack", "message_id": message_id, "seq": entry.seq,
                   "duplicate": False})
        self._broadcast(chat_id, {"type": "message", "message": entry.to_json()})

    def _inbox(self, chat_id: str) -> Path:
        return inbox_path(self._workspace, self.name, chat_id)

    def _inbound(self, entry: LogEntry) -> InboundMessage:
        media: tuple[Media, ...] = ()
        if entry.image:
            media = (Media(kind="audio" if is_audio(entry.image) else "image",
                           path=str(self._inbox(entry.chat_id) / entry.image["name"]),
                           mime=entry.image["mime"], size=entry.image["size"]),)
        assert entry.message_id is not None
        return InboundMessage(
            channel=self.name, chat_id=entry.chat_id, sender_id=entry.chat_id,
            text=entry.text, media=media, message_id=entry.message_id,
            kind=_inbound_kind(entry.text),
            received_at=datetime.fromisoformat(entry.created_at), chat_type="direct",
            trust="owner")  # only loopback or the token's holder reaches the page


def _message_id(data: dict[str, Any]) -> str | None:
    value = data.get("message_id")
    return value if isinstance(value, str) else None


def _inbound_kind(text: str) -> InboundKind:
    """Slash commands typed in the box go through like any message; the agent answers them."""
    return "command" if text.startswith("/") else "user"
