"""Discord replies shown while they are written (``channels.discord.streaming``): one message
sent, then edited in place; the final's first part is edited into it, the rest sent after.

discord.py waits out a 429 itself (its rate limiter, with Discord's ``retry_after``); a 429
it hands back (Cloudflare's, without Discord's headers) goes to the desk as ``retry_after``.
The first message carries a nonce made from the stream's key, so a create whose answer was
lost returns that message instead of a second one. An answer past 2000 characters shows its
latest part while it grows; each update is the whole text so far with an open code fence
closed (``interim_markdown``), so a fence is never cut mid-edit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from channels.base import Shown
from channels.chunking import chunk_markdown
from channels.discord_convert import (
    TEXT_LIMIT,
    TextPart,
    discord,
    map_errors,
    neutralise_mass_mentions,
    nonce_for,
    plan_parts,
    redact,
)
from channels.discord_outbound import SEND_ERRORS, Outbound
from channels.live_final import Edited, finish_into
from channels.sent_parts import SentParts
from gateway.kernel.events import MessageStage, OutboundMessage
from gateway.kernel.streams import interim_markdown
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)


def _snowflake(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _unknown_message(exc: BaseException) -> bool:
    return isinstance(exc, discord.NotFound)


class DiscordLive:
    def __init__(self, client: Callable[[], discord.Client | None], outbound: Outbound,
                 sent: SentParts, token: str) -> None:
        self._client = client
        self._outbound = outbound
        self._sent = sent
        self._secrets = (token,)

    def _where(self, msg: OutboundMessage) -> discord.PartialMessageable | None:
        client = self._client()
        target = _snowflake(msg.thread_id) or _snowflake(msg.chat_id)
        return client.get_partial_messageable(target) if client and target else None

    async def show(self, target: OutboundMessage, text: str,
                   message_id: str | None) -> Shown:
        where = self._where(target)
        if where is None:
            return Shown(message_id=message_id, error="not logged in to Discord yet")
        chunks = chunk_markdown(neutralise_mass_mentions(interim_markdown(text)), TEXT_LIMIT)
        if not chunks:
            return Shown(message_id=message_id)
        content = chunks[-1]
        try:
            if message_id is None:
                reply_to = _snowflake(target.reply_to)
                reference = discord.MessageReference(
                    message_id=reply_to, channel_id=where.id,
                    fail_if_not_exists=False) if reply_to else None
                sent = await self._outbound.post(
                    where, content, reference=reference,
                    nonce=nonce_for(f"{target.stream}:live", 0))
                return Shown(message_id=str(sent.id))
            await where.get_partial_message(int(message_id)).edit(content=content)
            return Shown(message_id=message_id)
        except SEND_ERRORS as exc:
            if _unknown_message(exc):  # deleted meanwhile: the next update starts anew
                return Shown(message_id=None, error="the shown message is gone")
            delivery = map_errors(exc, self._secrets)
            return Shown(message_id=message_id, retry_after=delivery.retry_after,
                         error=None if delivery.retry_after is not None else delivery.error)

    async def finish(self, msg: OutboundMessage, message_id: str) -> Delivery:
        """The final's first part edited into the shown message (``finish_into``)."""
        where = self._where(msg)
        if where is None:
            return Delivery(ok=False, error="not logged in to Discord yet", retry_after=5.0)
        parts = plan_parts(msg.text, msg.media)
        first = parts[0] if parts else None

        async def edit() -> Edited:
            assert isinstance(first, TextPart)
            try:
                await where.get_partial_message(int(message_id)).edit(content=first.content)
            except SEND_ERRORS as exc:
                if _unknown_message(exc):
                    return "gone"
                delivery = map_errors(exc, self._secrets)
                return "refused" if delivery.permanent else delivery
            return "done"

        return await finish_into(msg, message_id, first_is_text=isinstance(first, TextPart),
                                 sent=self._sent, edit=edit, send=self._outbound.send,
                                 remove=self.remove)

    async def reaction(self, event: MessageStage, emoji: str, previous: str | None) -> None:
        client = self._client()
        where = _snowflake(event.thread_id) or _snowflake(event.chat_id)
        if client is None or where is None or not event.message_id.isdigit():
            return
        await client.http.add_reaction(where, int(event.message_id), emoji)
        if previous is not None:
            await client.http.remove_own_reaction(where, int(event.message_id), previous)

    async def remove(self, target: OutboundMessage, message_id: str) -> None:
        where = self._where(target)
        if where is None:
            return
        try:
            await where.get_partial_message(int(message_id)).delete()
        except SEND_ERRORS as exc:
            _log.info("discord: could not remove a shown reply: %s",
                      redact(str(exc), self._secrets))
