"""The local channel: a fake chat platform for tests, the terminal and scripts.

In-process: ``inject``, ``wait_messages``, ``ask``. Over HTTP: ``POST /v1/messages`` → 202,
``GET /v1/messages?chat_id=&after=&wait=`` (long poll, ``wait`` capped at 60 s) and
``GET /v1/health``. A client may send its own ``message_id`` so that a retried POST is taken
once (``"duplicate": true`` in the answer). Every error is JSON ``{"error": "<field>: ..."}``:
400 for a bad field; 413 for oversize input (``text`` over ``max_text_chars``, ``media[i]``
over ``max_media_bytes``, ``body`` over what those allow); 401 for a missing or wrong bearer
token; 503 while the bus is closed. Without a token the server only listens on loopback,
because ``{"path"}`` media lets a caller hand the agent any file the gateway can read.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import logging
import math
import mimetypes
import re
import stat
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from channels.base import ChannelBase, ChannelDeps, ChannelStatus
from channels.http_api import ApiError, json_errors, listen
from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.config import LocalChannelConfig
from gateway.kernel.events import ChatType, InboundMessage, Media, MediaKind, OutboundMessage
from gateway.kernel.values import ChannelHints, Delivery

_log = logging.getLogger(__name__)

MAX_RECORDS_PER_CHAT = 1000
MAX_CHATS = 1000
MAX_RECORDS = 5000
"""Records kept in all (oldest chats' first out): clients read replies as they come, so memory
stays bounded however many sessions the gateway serves."""
MAX_IDEMPOTENCY_KEYS = 5000
MAX_MEDIA_ITEMS = 10
MAX_ID_CHARS = 256
MAX_WAIT_SECONDS = 60.0
ANSWER_KINDS = frozenset({"reply", "error", "notice"})

_POST_FIELDS = frozenset({"chat_id", "sender_id", "text", "sender_name", "chat_type",
                          "mentioned", "thread_id", "media", "message_id"})
_MIME = re.compile(r"[\w.+-]+/[\w.+-]+")
_SAFE_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")
_UINT = re.compile(r"[0-9]{1,18}")
_KINDS: dict[str, MediaKind] = {"image": "image", "audio": "audio", "video": "video"}


class LocalChannelError(Exception):
    """The local channel cannot do what was asked (unsafe listen address, stopped channel)."""


# --- pure validation --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PathMedia:
    index: int
    path: str


@dataclass(frozen=True, slots=True)
class InlineMedia:
    index: int
    data: bytes
    mime: str
    name: str


Spec = PathMedia | InlineMedia


def make_inbound(chat_id: str, text: str, *, sender_id: str = "u1", **fields: Any,
                 ) -> InboundMessage:
    return InboundMessage(channel=LocalChannel.name, chat_id=chat_id, sender_id=sender_id,
                          text=text, kind="command" if text.startswith("/") else "user",
                          **fields)


def max_body_bytes(max_text_chars: int, max_media_bytes: int) -> int:
    """The largest request body a valid message can need: base64 media plus escaped text."""
    return MAX_MEDIA_ITEMS * (_base64_len(max_media_bytes) + 4096) + 12 * max_text_chars + 65536


def _base64_len(n_bytes: int) -> int:
    return 4 * math.ceil(n_bytes / 3)


def _required(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ApiError(f"{key}: required, a non-empty string")
    return _optional(data, key) or value


def _optional(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ApiError(f"{key}: must be a non-empty string or null")
    if len(value) > MAX_ID_CHARS:
        raise ApiError(f"{key}: longer than {MAX_ID_CHARS} characters")
    if "\x00" in value:
        raise ApiError(f"{key}: contains a NUL character")
    return value


def parse_post_body(raw: bytes, *, max_text_chars: int,
                    max_media_bytes: int) -> tuple[InboundMessage, tuple[Spec, ...]]:
    """The message (media still to be stored) and its media specs, or ApiError."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError("body: not valid JSON") from None
    return validate_post(data, max_text_chars=max_text_chars, max_media_bytes=max_media_bytes)


def validate_post(data: Any, *, max_text_chars: int,
                  max_media_bytes: int) -> tuple[InboundMessage, tuple[Spec, ...]]:
    if not isinstance(data, dict):
        raise ApiError("body: must be a JSON object")
    unknown = sorted(set(data) - _POST_FIELDS)
    if unknown:
        raise ApiError(f"{unknown[0]}: unknown field")
    chat_id, sender_id = _required(data, "chat_id"), _required(data, "sender_id")
    text = data.get("text", "")
    if not isinstance(text, str):
        raise ApiError("text: must be a string")
    if len(text) > max_text_chars:
        raise ApiError(f"text: longer than {max_text_chars} characters", 413)
    if "\x00" in text:
        raise ApiError("text: contains a NUL character")
    chat_type = data.get("chat_type", "direct")
    if chat_type not in ("direct", "group"):
        raise ApiError('chat_type: must be "direct" or "group"')
    mentioned = data.get("mentioned", False)
    if not isinstance(mentioned, bool):
        raise ApiError("mentioned: must be true or false")
    media = _media_specs(data.get("media"), max_media_bytes)
    if not text and not media:
        raise ApiError("text: required, a non-empty string unless media is given")
    ids = {"message_id": message_id} if (message_id := _optional(data, "message_id")) else {}
    msg = make_inbound(chat_id, text, sender_id=sender_id, chat_type=chat_type,
                       sender_name=_optional(data, "sender_name"), mentioned=mentioned,
                       thread_id=_optional(data, "thread_id"), **ids)
    return msg, media


def _media_specs(value: Any, max_bytes: int) -> tuple[Spec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError("media: must be a list")
    if len(value) > MAX_MEDIA_ITEMS:
        raise ApiError(f"media: at most {MAX_MEDIA_ITEMS} items")
    return tuple(_media_spec(i, item, max_bytes) for i, item in enumerate(value))


def _media_spec(i: int, item: Any, max_bytes: int) -> PathMedia | InlineMedia:
    where = f"media[{i}]"
    if not isinstance(item, dict):
        raise ApiError(f"{where}: must be an object")
    if ("path" in item) == ("data_base64" in item):
        raise ApiError(f"{where}: needs either path or data_base64")
    allowed = {"path"} if "path" in item else {"data_base64", "mime", "name"}
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise ApiError(f"{where}.{unknown[0]}: unknown field")
    if "path" in item:
        path = item["path"]
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ApiError(f"{where}.path: must be a non-empty string")
        return PathMedia(i, path)
    mime, name, encoded = item.get("mime"), item.get("name", ""), item["data_base64"]
    if not isinstance(mime, str) or not _MIME.fullmatch(mime):
        raise ApiError(f"{where}.mime: required, a MIME type such as image/png")
    if not isinstance(name, str):
        raise ApiError(f"{where}.name: must be a string")
    if not isinstance(encoded, str):
        raise ApiError(f"{where}.data_base64: must be a string")
    if len(encoded) > _base64_len(max_bytes):  # refuse before spending memory on decoding
        raise ApiError(f"{where}.data_base64: larger than {max_bytes} bytes", 413)
    try:
        data = base64.b64decode(encoded, validate=True)
    except ValueError:
        raise ApiError(f"{where}.data_base64: not valid base64") from None
    if len(data) > max_bytes:
        raise ApiError(f"{where}.data_base64: larger than {max_bytes} bytes", 413)
    return InlineMedia(i, data, mime, name)


def parse_poll_query(query: Mapping[str, str]) -> tuple[str, int, float]:
    """``chat_id``, ``after`` and ``wait`` (capped at 60 s) of a ``GET /v1/messages``."""
    chat_id = _required(query, "chat_id")
    after = query.get("after", "0")
    if not _UINT.fullmatch(after):
        raise ApiError("after: must be an integer ≥ 0")
    try:
        wait = float(query.get("wait", "0"))
    except ValueError:
        raise ApiError("wait: must be a number of seconds") from None
    if not math.isfinite(wait) or wait < 0:
        raise ApiError(f"wait: must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}")
    return chat_id, int(after), min(wait, MAX_WAIT_SECONDS)


def media_kind(mime: str | None) -> MediaKind:
    return _KINDS.get((mime or "").split("/", 1)[0], "file")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- media on disk (blocking; run in a thread) ---------------------------------------------

def store_media(specs: Iterable[Spec], media_dir: Path,
                max_bytes: int) -> tuple[Media, ...]:
    """Check every path first, then write the inline files, so a refusal leaves nothing behind."""
    specs = tuple(specs)
    checked = {s.index: _path_media(s, max_bytes) for s in specs if isinstance(s, PathMedia)}
    return tuple(checked[s.index] if isinstance(s, PathMedia) else _save_inline(s, media_dir)
                 for s in specs)


def _path_media(spec: PathMedia, max_bytes: int) -> Media:
    where = f"media[{spec.index}].path"
    path = Path(spec.path).expanduser()
    try:
        info = path.stat()
    except (OSError, ValueError):
        raise ApiError(f"{where}: no such file") from None
    if not stat.S_ISREG(info.st_mode):
        raise ApiError(f"{where}: not a regular file")
    if info.st_size > max_bytes:
        raise ApiError(f"{where}: larger than {max_bytes} bytes", 413)
    mime = mimetypes.guess_type(path.name)[0]
    return Media(kind=media_kind(mime), path=str(path.resolve()), mime=mime, size=info.st_size)


def _save_inline(spec: InlineMedia, media_dir: Path) -> Media:
    """The client's ``name`` only lends a sanitized extension; the file name is ours."""
    suffix = PurePosixPath(spec.name.replace("\\", "/")).suffix
    if not _SAFE_SUFFIX.fullmatch(suffix):
        suffix = mimetypes.guess_extension(spec.mime) or ".bin"
    media_dir.mkdir(parents=True, exist_ok=True)
    target = media_dir / f"{uuid.uuid4().hex}{suffix.lower()}"
    with open(target, "xb") as fh:
        fh.write(spec.data)
    return Media(kind=media_kind(spec.mime), path=str(target), mime=spec.mime, size=len(spec.data))


# --- aiohttp middlewares ---------------------------------------------------------------------

def _bearer_auth(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "backslashreplace")
        if not hmac.compare_digest(given, expected):
            raise ApiError("authorization: missing or wrong bearer token", 401)
        return await handler(request)

    return check


# --- the channel ------------------------------------------------------------------------------

class LocalChannel(ChannelBase):
    name = "local"
    hints = ChannelHints(markup="Markdown (shown as plain text)", max_length=None,
                         etiquette="A test channel; answer as you would in a normal chat.")

    def __init__(self, config: LocalChannelConfig, bus: MessageBus, *, media_dir: Path,
                 health: Callable[[], dict[str, Any]] | None = None,
                 serve_http: bool = True) -> None:
        self.config = config
        self._bus = bus
        self._media_dir = media_dir
        self._health = health or dict
        self._serve_http = serve_http
        self._max_body = max_body_bytes(config.max_text_chars, config.max_media_bytes)
        self._records: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._deliveries: OrderedDict[str, Delivery] = OrderedDict()
        self._seq = 0
        self._stored = 0
        self._waiters: dict[str, set[asyncio.Event]] = {}
        """Long polls waiting per chat: a reply wakes only its own chat's pollers."""
        self._running = False
        self._closing = False
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.base_url: str | None = None

    async def start(self) -> None:
        if self._running:
            return
        self._closing = False
        if self._serve_http:
            await self._start_http()
        self._running = True

    async def _start_http(self) -> None:
        host, port = self.config.host, self.config.port
        if not self.config.token and not is_loopback(host):
            raise LocalChannelError(
                f"channels.local: refusing to listen on {host!r} without a token; "
                "set channels.local.token or listen on 127.0.0.1")
        middlewares: list[Middleware] = [json_errors(_log, "local channel")]
        if self.config.token:
            middlewares.append(_bearer_auth(self.config.token))
        app = web.Application(client_max_size=self._max_body, middlewares=middlewares)
        app.router.add_post("/v1/messages", self._post_message)
        app.router.add_get("/v1/messages", self._get_messages)
        app.router.add_get("/v1/health", self._get_health)
        self._runner, self.port = await listen(app, host, port, what="channels.local",
                                               error=LocalChannelError, shutdown_timeout=5.0)
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        _log.info("local channel listening on %s", self.base_url)

    async def stop(self) -> None:
        """Wake every long poll first, so the server's shutdown does not wait for them."""
        self._closing = True
        for events in self._waiters.values():
            for event in events:
                event.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._running = False

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=self._running and not self._closing,
                             detail={"url": self.base_url, "stored": self._stored})

    async def send(self, msg: OutboundMessage) -> Delivery:
        known = self._deliveries.get(msg.idempotency_key)
        if known is not None:
            return known
        self._seq += 1
        created = msg.created_at if msg.created_at.tzinfo else datetime.now(UTC)
        record = {"seq": self._seq, "chat_id": msg.chat_id, "text": msg.text,
                  "kind": msg.kind, "reply_to": msg.reply_to,
                  "media": [m.to_dict() for m in msg.media],
                  "created_at": created.astimezone(UTC).isoformat(),
                  "thread_id": msg.thread_id, "turn_id": msg.turn_id}
        records = self._records.get(msg.chat_id)
        if records is None:
            records = self._records[msg.chat_id] = deque(maxlen=MAX_RECORDS_PER_CHAT)
        else:
            self._records.move_to_end(msg.chat_id)
        self._stored += 1 - (len(records) == records.maxlen)
        records.append(record)
        self._prune()
        delivery = Delivery(ok=True, message_ids=(str(self._seq),))
        self._deliveries[msg.idempotency_key] = delivery
        while len(self._deliveries) > MAX_IDEMPOTENCY_KEYS:
            self._deliveries.popitem(last=False)
        for event in self._waiters.get(msg.chat_id, ()):
            event.set()
        return delivery

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
                     media: Iterable[Media] = ()) -> InboundMessage:
        msg = make_inbound(chat_id, text, sender_id=sender_id, sender_name=sender_name,
                           media=tuple(media), thread_id=thread_id, chat_type=chat_type,
                           mentioned=mentioned)
        await self._bus.publish_inbound(msg)
        return msg

    async def wait_messages(self, chat_id: str, *, after: int = 0,
                            timeout: float = 10.0,  # noqa: ASYNC109 - the contract's name
                            ) -> tuple[list[dict[str, Any]], int]:
        """Records of ``chat_id`` newer than ``after``, waiting up to ``timeout`` for one."""
        if timeout > 0 and not self._closing and self._last_seq(chat_id) <= after:
            event = asyncio.Event()
            waiters = self._waiters.setdefault(chat_id, set())
            waiters.add(event)
            try:
                async with asyncio.timeout(timeout):
                    while not self._closing and self._last_seq(chat_id) <= after:
                        event.clear()
                        await event.wait()
            except TimeoutError:
                pass
            finally:
                waiters.discard(event)
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

    # --- HTTP handlers ------------------------------------------------------------------------

    async def _post_message(self, request: web.Request) -> web.Response:
        too_big = ApiError(f"body: larger than {self._max_body} bytes", 413)
        if (request.content_length or 0) > self._max_body:
            raise too_big
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_big from None
        limit = self.config.max_media_bytes
        msg, specs = parse_post_body(raw, max_text_chars=self.config.max_text_chars,
                                     max_media_bytes=limit)
        if self._closing or self._bus.closed:
            raise ApiError("gateway is shutting down", 503)
        if specs:
            media = await asyncio.to_thread(store_media, specs, self._media_dir, limit)
            msg = replace(msg, media=media)
        try:
            new = await self._bus.publish_inbound(msg)
        except BusClosed:
            raise ApiError("gateway is shutting down", 503) from None
        body: dict[str, Any] = {"message_id": msg.message_id}
        if not new:
            body["duplicate"] = True  # a retry of a message already taken: not answered twice
        return web.json_response(body, status=202)

    async def _get_messages(self, request: web.Request) -> web.Response:
        chat_id, after, wait = parse_poll_query(request.query)
        found, next_seq = await self.wait_messages(chat_id, after=after, timeout=wait)
        return web.json_response({"messages": found, "next": next_seq})

    async def _get_health(self, request: web.Request) -> web.Response:
        data: dict[str, Any] = {"status": "ok", **self._health()}
        channels = data.setdefault("channels", {})
        if isinstance(channels, dict) and self.name not in channels:
            status = self.status()
            channels[self.name] = {"running": status.running, **status.detail}
        return web.json_response(data, dumps=partial(json.dumps, default=str))


def create(deps: ChannelDeps) -> LocalChannel:
    """The gateway's factory for ``channels.local``."""
    return LocalChannel(deps.config.channels.local, deps.bus,
                        media_dir=deps.data_path / "media" / "local", health=deps.health)
