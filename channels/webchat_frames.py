"""WebChat's wire protocol as pure functions: frame validation, images, origins and hosts.

Frames are JSON objects with a ``type``. From the page: ``auth`` ``{"token"}`` (first frame,
when a token is configured and no ``Authorization`` header came), ``message`` ``{"chat_id",
"message_id", "text", "image"?: {"data_base64", "mime", "name"?}, "audio"?: {"data_base64",
"mime"}}`` (a recording from the page's microphone; never with an image) and ``ping``. A refused
frame gets ``{"type": "error", "error": "<field>: <why>", "message_id", "retry"}``, naming the
field at fault, so the page can show the reason next to the message it concerns.

Live replies (``channels.webchat.streaming``): ``{"type": "partial", "stream", "text"}`` is
the answer so far (the whole text each time), ``{"type": "partial_end", "stream"}`` takes it
away (no answer follows), and the final ``message`` frame carries the same ``stream``.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from yarl import URL

from channels.http_api import ApiError, check_unicode
from gateway.kernel.frozen import frozen

CHAT_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
MESSAGE_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
UINT = re.compile(r"[0-9]{1,18}")
IMAGE_TYPES = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
               "image/webp": ".webp"}
"""Raster formats only: an SVG is a document that can carry script."""
AUDIO_TYPES = {"audio/webm": ".webm", "audio/ogg": ".ogg", "audio/mp4": ".m4a",
               "audio/mpeg": ".mp3", "audio/wav": ".wav"}
"""What browsers' MediaRecorder makes (Chrome: WebM, Firefox: Ogg, Safari: MP4), and files."""
UPLOAD_TYPES = {**IMAGE_TYPES, **AUDIO_TYPES}
_MESSAGE_FIELDS = frozenset({"type", "chat_id", "message_id", "text", "image", "audio"})
_IMAGE_FIELDS = frozenset({"data_base64", "mime", "name"})


PARTIAL = "partial"
"""What a page shows a reply in while it is written: no message of the log yet."""


def partial_frame(stream: str, text: str) -> dict[str, Any]:
    return {"type": "partial", "stream": stream, "text": text}


class FrameError(Exception):
    """A refused frame; ``message`` starts with the field at fault."""

    def __init__(self, message: str, *, message_id: str | None = None,
                 retry: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.message_id = message_id
        self.retry = retry
        """True when sending the same frame again later can succeed (gateway restarting)."""

    def frame(self) -> dict[str, Any]:
        return {"type": "error", "error": self.message, "message_id": self.message_id,
                "retry": self.retry}


@frozen
class ImageData:
    data: bytes
    mime: str


@frozen
class ClientMessage:
    chat_id: str
    message_id: str
    text: str
    image: ImageData | None
    audio: ImageData | None = None


def human_bytes(n: int) -> str:
    for unit, size in (("MB", 1024 * 1024), ("KB", 1024)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def base64_len(n_bytes: int) -> int:
    return 4 * math.ceil(n_bytes / 3)


def max_frame_bytes(max_text_chars: int, max_image_bytes: int) -> int:
    """The largest frame a valid message can need (JSON may escape a character to 6 bytes)."""
    return base64_len(max_image_bytes) + 6 * max_text_chars + 16 * 1024


def check_chat_id(value: Any, where: str = "chat_id") -> str:
    if not isinstance(value, str) or not CHAT_ID.fullmatch(value):
        raise FrameError(f"{where}: required, 8 to 64 letters, digits, '-' or '_'")
    return value


def query_uint(query: Mapping[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None:
        return None
    if not UINT.fullmatch(value):
        raise FrameError(f"{key}: must be an integer ≥ 0")
    return int(value)


def parse_frame(raw: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise FrameError("frame: not valid JSON") from None
    if not isinstance(data, dict):
        raise FrameError("frame: must be a JSON object")
    try:
        check_unicode(data)
    except ApiError as exc:
        raise FrameError(exc.message) from None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise FrameError("type: required, a string")
    return data


def parse_message(data: dict[str, Any], *, chat_id: str, max_text_chars: int,
                  max_image_bytes: int, max_audio_bytes: int = 0) -> ClientMessage:
    """A ``message`` frame of the socket opened for ``chat_id``, or FrameError."""
    raw_id = data.get("message_id")
    if not isinstance(raw_id, str) or not MESSAGE_ID.fullmatch(raw_id):
        raise FrameError("message_id: required, 8 to 64 letters, digits, '-' or '_'")
    message_id = raw_id

    def fail(message: str) -> FrameError:
        return FrameError(message, message_id=message_id)

    unknown = sorted(set(data) - _MESSAGE_FIELDS)
    if unknown:
        raise fail(f"{unknown[0]}: unknown field")
    if data.get("chat_id") != chat_id:
        raise fail("chat_id: must be the chat this connection was opened for")
    text = data.get("text", "")
    if not isinstance(text, str):
        raise fail("text: must be a string")
    if len(text) > max_text_chars:
        raise fail(f"text: longer than {max_text_chars:,} characters")
    if "\x00" in text:
        raise fail("text: contains a NUL character")
    image = None
    if data.get("image") is not None:
        try:
            image = parse_image(data["image"], max_image_bytes)
        except FrameError as exc:
            raise fail(exc.message) from None
    audio = None
    if data.get("audio") is not None:
        if image is not None:
            raise fail("audio: a recording is sent on its own, without an image")
        try:
            audio = parse_audio(data["audio"], max_audio_bytes)
        except FrameError as exc:
            raise fail(exc.message) from None
    if not text.strip() and image is None and audio is None:
        raise fail("text: required, unless an image or a recording is sent")
    return ClientMessage(chat_id, message_id, text, image, audio)


def parse_image(value: Any, max_bytes: int) -> ImageData:
    return _upload(value, "image", IMAGE_TYPES, sniff_image, max_bytes)


def parse_audio(value: Any, max_bytes: int) -> ImageData:
    """A recording; ``audio/webm;codecs=opus`` is taken as ``audio/webm``."""
    if max_bytes <= 0:
        raise FrameError("audio: recordings are not accepted here")
    if isinstance(value, dict) and isinstance(value.get("mime"), str):
        value = {**value, "mime": value["mime"].split(";", 1)[0].strip().lower()}
    return _upload(value, "audio", AUDIO_TYPES, sniff_audio, max_bytes)


def _upload(value: Any, field: str, types: Mapping[str, str],
            sniff: Callable[[bytes], str | None], max_bytes: int) -> ImageData:
    if not isinstance(value, dict):
        raise FrameError(f"{field}: must be an object with data_base64 and mime")
    unknown = sorted(set(value) - _IMAGE_FIELDS)
    if unknown:
        raise FrameError(f"{field}.{unknown[0]}: unknown field")
    mime, encoded = value.get("mime"), value.get("data_base64")
    if not isinstance(mime, str) or mime not in types:
        raise FrameError(f"{field}.mime: must be one of {', '.join(types)}")
    if not isinstance(encoded, str) or not encoded:
        raise FrameError(f"{field}.data_base64: required, a base64 string")
    too_big = FrameError(f"{field}: larger than the {human_bytes(max_bytes)} limit")
    if len(encoded) > base64_len(max_bytes):  # refuse before spending memory on decoding
        raise too_big
    try:
        data = base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error):
        raise FrameError(f"{field}.data_base64: not valid base64") from None
    if len(data) > max_bytes:
        raise too_big
    if sniff(data) != mime:
        raise FrameError(f"{field}.data_base64: not a {mime} {field}")
    return ImageData(data, mime)


def sniff_image(data: bytes) -> str | None:
    """The image type the bytes really are, so a file is never served under a false type."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def sniff_audio(data: bytes) -> str | None:
    """The recording's container, so a file is never stored or served under a false type."""
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "audio/webm"
    if data.startswith(b"OggS"):
        return "audio/ogg"
    if data[4:8] == b"ftyp":
        return "audio/mp4"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data.startswith(b"ID3") or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    return None


# --- origins and hosts -------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str | None:
    """``Host: 127.0.0.1:8766`` → ``127.0.0.1``; ``[::1]:8766`` → ``::1``; None if unparsable."""
    try:
        return URL(f"http://{host_header}").host
    except ValueError:
        return None


def origin_allowed(origin: str | None, *, scheme: str, host_header: str,
                   allowed: list[str]) -> bool:
    """The page's own origin (scheme + Host) or one listed in ``allowed_origins``.

    A missing ``Origin`` is a non-browser client, which no browser page can pose as; the token
    (required beyond loopback) is what keeps those out.
    """
    if origin is None:
        return True
    origin = origin.lower().rstrip("/")
    return origin == f"{scheme}://{host_header}".lower() or origin in allowed


def host_allowed(host_header: str, *, allowed_origins: list[str]) -> bool:
    """Without a token, only loopback names (and the hosts of ``allowed_origins``) are served:
    a DNS-rebinding page (``evil.example`` resolved to 127.0.0.1) is then refused, since the
    browser still sends its own name as ``Host``."""
    name = host_name(host_header)
    if name is None:
        return False
    return is_loopback(name) or any(URL(o).host == name for o in allowed_origins)
