"""Telegram output: replies cut into parts and sent in order, media; and the two calls the
shared inbound pipeline makes on Telegram (``PlatformIO``): notices and downloading a file.

A reply is planned into parts (``plan_parts``: chunks of HTML, then media), and every part that
Telegram accepted is recorded in ``SentParts`` before the next is sent; a part whose "ok"
answer PTB could not read counts as accepted (its id unknown), and one whose answer never came
is reported as an unknown outcome (``Delivery.unknown``: resent at most once). A retry of the same
``OutboundMessage`` (after a 429, a network error, or a restart) resumes at the first part not
yet delivered, so no part is ever sent twice. A chunk whose HTML Telegram refuses is resent as
plain text; in groups the first part quotes the user's message; topics get their thread id.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from pathlib import Path
from typing import TypedDict

from telegram import Bot, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, RetryAfter, TelegramError

from channels.incoming import Attachment, DownloadFailed, Fetched, Incoming
from channels.sent_parts import SentParts
from channels.telegram_convert import (
    MAX_UPLOAD_BYTES,
    MediaPart,
    Part,
    file_suffix,
    is_group_chat_id,
    is_parse_error,
    map_errors,
    photo_or_document,
    plan_parts,
    redact,
    retry_seconds,
)
from gateway.kernel.backoff import Backoff
from gateway.kernel.events import Media, OutboundMessage, utcnow
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)

UNREADABLE_ANSWER = (TypeError, KeyError, ValueError, AttributeError)
"""What python-telegram-bot raises when a successful answer lacks what its objects need."""
UNKNOWN_ID = "unknown"
"""The id recorded for a part Telegram accepted without a readable answer."""


class _Where(TypedDict):
    message_thread_id: int | None
    reply_parameters: ReplyParameters | None


class Outbound:
    def __init__(self, bot: Bot, sent: SentParts, token: str) -> None:
        self._bot = bot
        self._sent = sent
        self._secrets = (token,)
        self.last_send_ok: datetime | None = None

    async def send(self, msg: OutboundMessage) -> Delivery:
        if msg.kind == "progress" or (not msg.text.strip() and not msg.media):
            return Delivery(ok=True)
        key = msg.idempotency_key
        done = await self._sent.sent(key)
        parts = plan_parts(msg.text, msg.media)
        for index in range(len(done), len(parts)):
            try:
                message_id = await self.send_part(msg, parts[index], first=index == 0)
            except TelegramError as exc:
                delivery = map_errors(exc, self._secrets)
                _log.warning("telegram: part %d/%d to chat %s failed%s: %s", index + 1,
                             len(parts), msg.chat_id,
                             " (it may have arrived)" if delivery.unknown else "",
                             delivery.error)
                return delivery
            except UNREADABLE_ANSWER as exc:
                # PTB raises its own errors for every refusal and network failure; this is an
                # "ok" answer it could not read: Telegram has the message, do not send it again.
                _log.warning("telegram: part %d/%d to chat %s was accepted but the answer was "
                             "malformed (%s: %s); counted as delivered", index + 1, len(parts),
                             msg.chat_id, type(exc).__name__, redact(str(exc), self._secrets))
                message_id = UNKNOWN_ID
            await self._sent.record(key, index, message_id, msg.chat_id)
            done.append(message_id)
            self.last_send_ok = utcnow()
        return Delivery(ok=True, message_ids=tuple(done))

    async def send_part(self, msg: OutboundMessage, part: Part, *, first: bool) -> str:
        """One part of ``msg`` sent; its message id (``first``: it may quote the user)."""
        quote = None
        if first and is_group_chat_id(msg.chat_id) and msg.reply_to and msg.reply_to.isdigit():
            quote = ReplyParameters(int(msg.reply_to), allow_sending_without_reply=True)
        thread = int(msg.thread_id) if msg.thread_id and msg.thread_id.isdigit() else None
        where = _Where(message_thread_id=thread, reply_parameters=quote)
        if isinstance(part, MediaPart):
            return await self._send_media(msg.chat_id, part.media, where)
        if part.html is not None:
            try:
                sent = await self._bot.send_message(msg.chat_id, part.html,
                                                    parse_mode=ParseMode.HTML, **where)
                return str(sent.message_id)
            except BadRequest as exc:
                if not is_parse_error(exc):
                    raise
                _log.warning("telegram: HTML refused (%s); sending that part as plain text",
                             exc.message)
        sent = await self._bot.send_message(msg.chat_id, part.plain, **where)
        return str(sent.message_id)

    async def _send_media(self, chat_id: str, media: Media, where: _Where) -> str:
        bot = self._bot
        if media.url is not None:
            if photo_or_document(media, None) == "photo":
                return str((await bot.send_photo(chat_id, media.url, **where)).message_id)
            return str((await bot.send_document(chat_id, media.url, **where)).message_id)
        path = Path(media.path or "")
        size = await asyncio.to_thread(_file_size, path)
        problem = "not found" if size is None else \
            "too big to send (Telegram takes up to 50 MB)" if size > MAX_UPLOAD_BYTES else None
        if problem:
            sent = await bot.send_message(chat_id, f"(Could not attach {path.name}: {problem}.)",
                                          **where)
            return str(sent.message_id)
        data = await asyncio.to_thread(path.read_bytes)
        if media.kind == "audio" and media.mime == "audio/ogg":  # a spoken answer
            sent = await bot.send_voice(chat_id, data, filename=path.name, **where)
            return str(sent.message_id)
        if photo_or_document(media, size) == "photo":
            try:
                sent = await bot.send_photo(chat_id, data, filename=path.name, **where)
                return str(sent.message_id)
            except BadRequest as exc:  # odd dimensions, unreadable image: send it as a file
                _log.info("telegram: photo refused (%s); sending as a document", exc.message)
        sent = await bot.send_document(chat_id, data, filename=path.name, **where)
        return str(sent.message_id)

    async def notice(self, inc: Incoming, text: str, *, reply: bool) -> None:
        """A plain message from the channel itself (pairing, refusals): best effort, 3 tries.
        Quotes ``inc`` only in groups, as replies do."""
        quote = ReplyParameters(int(inc.id), allow_sending_without_reply=True) \
            if reply and not inc.direct and inc.id.isdigit() else None
        thread = int(inc.thread_id) if inc.thread_id and inc.thread_id.isdigit() else None
        backoff = Backoff()
        for _ in range(3):
            try:
                await self._bot.send_message(inc.where, text, reply_parameters=quote,
                                             message_thread_id=thread)
                return
            except RetryAfter as exc:
                await asyncio.sleep(retry_seconds(exc))
            except BadRequest as exc:
                _log.warning("telegram: notice refused: %s", redact(exc.message, self._secrets))
                return
            except TelegramError as exc:
                _log.warning("telegram: notice failed: %s", redact(exc.message, self._secrets))
                await asyncio.sleep(backoff.next())

    async def fetch(self, inc: Incoming, index: int, att: Attachment,
                    limit: int) -> Fetched | None:
        """getFile, then the download; None when Telegram's size is over ``limit``."""
        try:
            file = await self._bot.get_file(att.source)
            if (file.file_size or 0) > limit:
                return None
            data = await file.download_as_bytearray()
        except TelegramError as exc:
            raise DownloadFailed(redact(exc.message, self._secrets)) from exc
        name = att.name or f"{inc.id}-{att.label.split()[0]}{file_suffix(att, file.file_path)}"
        return Fetched(bytes(data), name)


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None
