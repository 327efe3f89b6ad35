"""What the local channel's HTTP API accepts: a ``POST /v1/messages`` body and a
``GET /v1/messages`` query checked field by field (``ApiError`` names the field), media specs
stored to disk, and the bearer-token check.

Pure functions apart from ``store_media`` (blocking; run it in a thread). Separate from
``local.py``, which holds the channel itself (its record log, the in-process API and the thin
handlers that call these), so the request contract reads on its own.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import math
import mimetypes
import re
import stat
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from channels.http_api import ApiError, check_unicode
from gateway.kernel.events import TRUST_RANK, InboundMessage, Media, MediaKind, Trust
from gateway.kernel.frozen import frozen
from gateway.kernel.inbox_files import save_file
from gateway.kernel.store_db import load_json

CHANNEL_NAME = "local"
MAX_MEDIA_ITEMS = 10
MAX_ID_CHARS = 256
MAX_WAIT_SECONDS = 60.0

_POST_FIELDS = frozenset({"chat_id", "sender_id", "text", "sender_name", "chat_type",
                          "mentioned", "thread_id", "media", "message_id", "trust"})
_MIME = re.compile(r"[\w.+-]+/[\w.+-]+")
_SAFE_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")
_UINT = re.compile(r"[0-9]{1,18}")
_KINDS: dict[str, MediaKind] = {"image": "image", "audio": "audio", "video": "video"}


# --- pure validation --------------------------------------------------------------------------

@frozen
class PathMedia:
    index: int
    path: str


@frozen
class InlineMedia:
    index: int
    data: bytes
    mime: str
    name: str


Spec = PathMedia | InlineMedia


def make_inbound(chat_id: str, text: str, *, sender_id: str = "u1", trust: Trust = "owner",
                 **fields: Any) -> InboundMessage:
    """A local message: the owner's (only loopback or the token's holder can post), unless the
    caller lowers ``trust`` to try the agent as a member or a guest."""
    return InboundMessage(channel=CHANNEL_NAME, chat_id=chat_id, sender_id=sender_id,
                          text=text, kind="command" if text.startswith("/") else "user",
                          trust=trust, **fields)


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
        data = load_json(raw)
    except (ValueError, RecursionError):
        raise ApiError("body: not valid JSON") from None
    check_unicode(data)
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
    trust = data.get("trust", "owner")
    if trust not in TRUST_RANK:
        raise ApiError('trust: must be "owner", "member" or "guest"')
    media = _media_specs(data.get("media"), max_media_bytes)
    if not text and not media:
        raise ApiError("text: required, a non-empty string unless media is given")
    ids = {"message_id": message_id} if (message_id := _optional(data, "message_id")) else {}
    msg = make_inbound(chat_id, text, sender_id=sender_id, chat_type=chat_type,
                       sender_name=_optional(data, "sender_name"), mentioned=mentioned,
                       thread_id=_optional(data, "thread_id"), trust=trust, **ids)
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

def store_media(specs: Iterable[Spec], folder: Path,
                max_bytes: int) -> tuple[Media, ...]:
    """Check every path first, then copy those files and write the inline ones into the chat's
    inbox ``folder`` (inside the workspace, where the agent's file tools reach), so a refusal
    leaves nothing behind."""
    specs = tuple(specs)
    checked = {s.index: _path_media(s, max_bytes) for s in specs if isinstance(s, PathMedia)}
    return tuple(_copy_in(checked[s.index], folder) if isinstance(s, PathMedia)
                 else _save_inline(s, folder) for s in specs)


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


def _copy_in(media: Media, folder: Path) -> Media:
    """A copy of a file the client named by path, in the inbox under its own (safe) name."""
    assert media.path is not None
    source = Path(media.path)
    data = source.read_bytes()
    return replace(media, path=str(save_file(folder, source.name, data)), size=len(data))


def _save_inline(spec: InlineMedia, folder: Path) -> Media:
    """The client's ``name`` only lends a sanitized extension; the file name is ours."""
    suffix = PurePosixPath(spec.name.replace("\\", "/")).suffix
    if not _SAFE_SUFFIX.fullmatch(suffix):
        suffix = mimetypes.guess_extension(spec.mime) or ".bin"
    target = save_file(folder, f"{uuid.uuid4().hex}{suffix.lower()}", spec.data)
    return Media(kind=media_kind(spec.mime), path=str(target), mime=spec.mime, size=len(spec.data))


# --- aiohttp middlewares ---------------------------------------------------------------------

def bearer_auth(token: str) -> Middleware:
    """Refuse (401) a request without ``Authorization: Bearer <token>``, compared in
    constant time."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "backslashreplace")
        if not hmac.compare_digest(given, expected):
            raise ApiError("authorization: missing or wrong bearer token", 401)
        return await handler(request)

    return check
