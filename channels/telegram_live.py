"""Telegram replies shown while they are written (``channels.telegram.streaming``).

Private chats get Bot API draft streaming (``sendMessageDraft``, Bot API 9.3+): an animated
draft that leaves nothing behind, so the final is sent as any reply. Where drafts are not
offered (groups, and a chat where the server refused one: an older Bot API server, a bot
without the feature) one message is sent and edited in place (``editMessageText``), and the
final's first part is edited into it (``finish``); the rest of a long answer follows as new
messages, resumed through ``SentParts`` like any reply, so nothing is sent twice.

Each update renders the whole text so far to Telegram HTML (an open code fence closed first,
``interim_markdown``), so an entity or a fence is never cut in the middle; an answer past one
message shows its latest part while it grows. A 429's ``retry_after`` is handed back to the
desk, which waits it out.
"""

from __future__ import annotations

import logging
import zlib

from telegram import Bot, ReactionTypeEmoji
from telegram.constants import ParseMode
from telegram.error import BadRequest, RetryAfter, TelegramError

from channels.base import Shown
from channels.live_final import Edited, finish_into
from channels.sent_parts import SentParts
from channels.telegram_convert import (
    TextPart,
    is_group_chat_id,
    is_parse_error,
    map_errors,
    plan_parts,
    redact,
    retry_seconds,
    text_parts,
)
from channels.telegram_outbound import Outbound
from gateway.kernel.events import MessageStage, OutboundMessage, Stage
from gateway.kernel.streams import interim_markdown
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)

REACTIONS: dict[Stage, str] = {"taken": "👀", "queued": "🥱", "done": "👌", "failed": "😢"}
"""Bots may react with Telegram's standard set only (no ✅, ❌ or ⏳ there)."""


def draft_id(key: str) -> int:
    """A non-zero draft id that stays the same for one reply (edits of it are animated)."""
    return (zlib.crc32(key.encode()) & 0x7FFFFFFF) or 1


def _not_modified(exc: TelegramError) -> bool:
    return isinstance(exc, BadRequest) and "not modified" in exc.message.lower()


def _gone(exc: TelegramError) -> bool:
    return isinstance(exc, BadRequest) and "message to edit not found" in exc.message.lower()


class TelegramLive:
    def __init__(self, bot: Bot, outbound: Outbound, sent: SentParts, token: str) -> None:
        self._bot = bot
        self._outbound = outbound
        self._sent = sent
        self._secrets = (token,)
        self.no_drafts: set[str] = set()
        """Chats where a draft was refused: edited in place from then on."""

    async def show(self, target: OutboundMessage, text: str,
                   message_id: str | None) -> Shown:
        parts = text_parts(interim_markdown(text))
        if not parts:
            return Shown(message_id=message_id)
        part = parts[-1]
        try:
            if message_id is None and self._drafts(target):
                if await self._draft(target, part):
                    return Shown()
            if message_id is None:
                return Shown(message_id=await self._outbound.send_part(target, part,
                                                                       first=True))
            await self._edit(target.chat_id, message_id, part)
            return Shown(message_id=message_id)
        except RetryAfter as exc:
            return Shown(message_id=message_id, retry_after=retry_seconds(exc))
        except TelegramError as exc:
            if _not_modified(exc):
                return Shown(message_id=message_id)
            if _gone(exc):  # deleted meanwhile: the next update starts a new message
                return Shown(message_id=None, error="the shown message is gone")
            return Shown(message_id=message_id,
                         error=redact(f"{type(exc).__name__}: {exc.message}", self._secrets))

    def _drafts(self, target: OutboundMessage) -> bool:
        return not is_group_chat_id(target.chat_id) and target.chat_id not in self.no_drafts

    async def _draft(self, target: OutboundMessage, part: TextPart) -> bool:
        """True when the draft was shown; False (and never again in this chat) when the
        server does not offer drafts here. A 429 is raised to the caller."""
        thread = int(target.thread_id) if target.thread_id and target.thread_id.isdigit() \
            else None
        key = draft_id(target.stream or target.idempotency_key)
        try:
            try:
                await self._bot.send_message_draft(
                    int(target.chat_id), key, part.html or part.plain,
                    parse_mode=ParseMode.HTML if part.html else None,
                    message_thread_id=thread)
            except BadRequest as exc:
                if not is_parse_error(exc):
                    raise
                await self._bot.send_message_draft(int(target.chat_id), key, part.plain,
                                                   message_thread_id=thread)
        except RetryAfter:
            raise
        except (TelegramError, ValueError) as exc:
            detail = exc.message if isinstance(exc, TelegramError) else str(exc)
            _log.info("telegram: no drafts in chat %s (%s); editing one message instead",
                      target.chat_id, redact(detail, self._secrets))
            self.no_drafts.add(target.chat_id)
            return False
        return True

    async def _edit(self, chat_id: str, message_id: str, part: TextPart) -> None:
        if part.html is not None:
            try:
                await self._bot.edit_message_text(part.html, chat_id=chat_id,
                                                  message_id=int(message_id),
                                                  parse_mode=ParseMode.HTML)
                return
            except BadRequest as exc:
                if not is_parse_error(exc):
                    raise
        await self._bot.edit_message_text(part.plain, chat_id=chat_id,
                                          message_id=int(message_id))

    async def finish(self, msg: OutboundMessage, message_id: str) -> Delivery:
        """The final's first part edited into the shown message (``finish_into``)."""
        parts = plan_parts(msg.text, msg.media)
        first = parts[0] if parts else None

        async def edit() -> Edited:
            assert isinstance(first, TextPart)
            try:
                await self._edit(msg.chat_id, message_id, first)
            except TelegramError as exc:
                if _gone(exc):
                    return "gone"
                if _not_modified(exc):
                    return "done"
                return "refused" if isinstance(exc, BadRequest) else \
                    map_errors(exc, self._secrets)
            return "done"

        return await finish_into(msg, message_id, first_is_text=isinstance(first, TextPart),
                                 sent=self._sent, edit=edit, send=self._outbound.send,
                                 remove=self.remove)

    async def reaction(self, event: MessageStage, emoji: str, previous: str | None) -> None:
        """``setMessageReaction`` replaces the bot's reaction: ``previous`` goes by itself."""
        await self._bot.set_message_reaction(event.chat_id, int(event.message_id),
                                             [ReactionTypeEmoji(emoji)])

    async def remove(self, target: OutboundMessage, message_id: str) -> None:
        try:
            await self._bot.delete_message(target.chat_id, int(message_id))
        except TelegramError as exc:
            _log.info("telegram: could not remove a shown reply: %s",
                      redact(exc.message, self._secrets))
