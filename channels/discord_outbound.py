"""Discord output: replies cut into parts and sent in order, files; and the two calls the
shared inbound pipeline makes on Discord (``PlatformIO``): notices and downloading a file.

A reply is planned into parts (``plan_parts``: chunks of at most 2000 characters, then one
message per file). Every part Discord accepted is recorded in ``SentParts`` before the next is
sent, so a retry of the same ``OutboundMessage`` (after an error, or a restart) resumes at the
first part not yet delivered. Each part also carries a ``nonce`` derived from the message's
idempotency key with ``enforce_nonce``: when Discord created a message but its answer was lost
on the way or could not be read, the retry gets that message back instead of a second copy,
so a Discord send never has an unknown outcome (``Delivery.unknown``): it is checked, not
guessed.

The first part replies to the user's message (a message reference; the author is pinged only
with ``reply_ping``), threads are answered in the thread, and ``allowed_mentions`` keeps the
model's text from pinging anyone unless ``allow_mentions``.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from channels.common import read_small
from channels.discord_convert import (
    FilePart,
    Part,
    TextPart,
    allowed_mentions,
    discord,
    is_too_large,
    map_errors,
    nonce_for,
    plan_parts,
    redact,
    stored_name,
)
from channels.incoming import Attachment, DownloadFailed, Fetched, Incoming, human_size
from channels.sent_parts import SentParts
from gateway.kernel.backoff import Backoff
from gateway.kernel.config import DiscordChannelConfig
from gateway.kernel.events import OutboundMessage, utcnow
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)

SEND_ERRORS = (discord.DiscordException, aiohttp.ClientError, OSError, TimeoutError)
"""What a REST call through discord.py raises when Discord or the network fails."""


def _snowflake(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


class Outbound:
    def __init__(self, client: Callable[[], discord.Client | None], sent: SentParts,
                 config: DiscordChannelConfig, token: str) -> None:
        """``client()``: the logged-in client, or None while there is none."""
        self._client = client
        self._sent = sent
        self.config = config
        self._secrets = (token,)
        self._mentions = allowed_mentions(allow_mentions=config.allow_mentions,
                                          reply_ping=config.reply_ping)
        self.last_send_ok: datetime | None = None

    async def send(self, msg: OutboundMessage) -> Delivery:
        if msg.kind == "progress" or (not msg.text.strip() and not msg.media):
            return Delivery(ok=True)
        target = _snowflake(msg.thread_id) or _snowflake(msg.chat_id)
        if target is None:
            return Delivery(ok=False, error=f"{msg.chat_id!r} is not a Discord channel id",
                            permanent=True)
        client = self._client()
        if client is None:
            return Delivery(ok=False, error="not logged in to Discord yet", retry_after=5.0)
        key = msg.idempotency_key
        done = await self._sent.sent(key)
        parts = plan_parts(msg.text, msg.media)
        where = client.get_partial_messageable(target)
        for index in range(len(done), len(parts)):
            reply_to = _snowflake(msg.reply_to) if index == 0 else None
            reference = discord.MessageReference(
                message_id=reply_to, channel_id=target,
                fail_if_not_exists=False) if reply_to else None
            try:
                sent = await self._send_part(where, parts[index], reference,
                                             nonce_for(key, index))
            except SEND_ERRORS as exc:
                delivery = map_errors(exc, self._secrets)
                _log.warning("discord: part %d/%d to channel %s failed: %s", index + 1,
                             len(parts), target, delivery.error)
                return delivery
            except Exception as exc:  # an answer discord.py could not read
                # The part may exist; its nonce makes the retry return it instead of a copy.
                error = redact(f"malformed answer: {type(exc).__name__}: {exc}", self._secrets)
                _log.warning("discord: part %d/%d to channel %s: %s; the retry is checked by "
                             "its nonce", index + 1, len(parts), target, error)
                return Delivery(ok=False, error=error)
            await self._sent.record(key, index, str(sent.id), msg.chat_id)
            done.append(str(sent.id))
            self.last_send_ok = utcnow()
        return Delivery(ok=True, message_ids=tuple(done))

    async def _send_part(self, where: discord.PartialMessageable, part: Part,
                         reference: discord.MessageReference | None,
                         nonce: str) -> discord.Message:
        if isinstance(part, TextPart):
            return await self.post(where, part.content, reference=reference, nonce=nonce)
        return await self._send_file(where, part, reference, nonce)

    async def post(self, where: discord.PartialMessageable, content: str | None = None, *,
                   file: discord.File | None = None,
                   reference: discord.MessageReference | None = None,
                   nonce: str | None = None) -> discord.Message:
        """One message, mentions as configured (``nonce``: a resend returns it)."""
        options: dict[str, Any] = {"allowed_mentions": self._mentions}
        if file is not None:
            options["file"] = file
        if reference is not None:
            options["reference"] = reference
        if nonce is not None:
            options["nonce"] = nonce
        return await where.send(content, **options)

    async def _send_file(self, where: discord.PartialMessageable, part: FilePart,
                         reference: discord.MessageReference | None,
                         nonce: str) -> discord.Message:
        media = part.media
        if media.url is not None:  # Discord shows a preview of the link
            return await self.post(where, media.url, reference=reference, nonce=nonce)
        path = Path(media.path or "")
        limit = self.config.max_media_bytes
        data = await asyncio.to_thread(read_small, path, limit)
        if data is None:
            problem = "not found"
        elif isinstance(data, int):
            problem = f"too big to send (over {human_size(limit)})"
        else:
            try:
                file = discord.File(io.BytesIO(data), filename=path.name)
                return await self.post(where, file=file, reference=reference, nonce=nonce)
            except discord.HTTPException as exc:
                if not is_too_large(exc):
                    raise
                problem = "too big for this Discord server"
        return await self.post(where, f"(Could not attach {path.name}: {problem}.)",
                                reference=reference, nonce=nonce)

    async def notice(self, inc: Incoming, text: str, *, reply: bool) -> None:
        """A plain message from the channel itself (pairing, refusals): best effort, 3 tries."""
        client = self._client()
        target = _snowflake(inc.where)
        if client is None or target is None:
            return
        where = client.get_partial_messageable(target)
        ref = _snowflake(inc.id) if reply else None
        reference = discord.MessageReference(message_id=ref, channel_id=target,
                                             fail_if_not_exists=False) if ref else None
        backoff = Backoff()
        for _ in range(3):
            try:
                await self.post(where, text, reference=reference)
                return
            except discord.HTTPException as exc:
                if exc.status < 500:
                    _log.warning("discord: notice refused: %s",
                                 redact(str(exc), self._secrets))
                    return
                delay = backoff.next()
            except SEND_ERRORS as exc:
                _log.warning("discord: notice failed: %s", redact(str(exc), self._secrets))
                delay = backoff.next()
            await asyncio.sleep(delay)

    async def fetch(self, inc: Incoming, index: int, att: Attachment,
                    limit: int) -> Fetched | None:
        """From Discord's CDN, saved as ``<message id>-<n>-<name>``."""
        client = self._client()
        if client is None:
            raise DownloadFailed("not logged in to Discord")
        try:
            data = await client.http.get_from_cdn(att.source)
        except SEND_ERRORS as exc:
            raise DownloadFailed(redact(str(exc), self._secrets)) from exc
        return Fetched(data, stored_name(inc.id, index, att.name or att.label))
