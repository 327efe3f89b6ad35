"""Telegram input: one message → access check → pairing, context, or messages for the bus.

``prepare()`` does everything but publishing: the channel publishes what it returns and only
then moves the update offset. Group messages the bot does not answer wait in memory (at most
``group_history`` per chat or topic) and go to the bus as context-only messages right before
the next message it answers, so the agent sees what was said when it is addressed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from pathlib import Path

from telegram import Bot, Message, User
from telegram.error import TelegramError

from channels.common import GroupContext
from channels.telegram_access import Access
from channels.telegram_convert import (
    NAME,
    addressing,
    chat_type,
    display_name,
    file_suffix,
    media_ref,
    message_text,
    redact,
    to_inbound,
    too_big_note,
    too_big_reply,
)
from channels.telegram_outbound import Outbound
from gateway.kernel.config import TelegramChannelConfig
from gateway.kernel.events import InboundMessage, Media
from gateway.kernel.pairing import PairingFull, PairingStore

_log = logging.getLogger(__name__)

MAX_CONTEXT_CHATS = 500


class Inbound:
    def __init__(self, config: TelegramChannelConfig, *, bot: Bot, pairing: PairingStore,
                 outbound: Outbound, media_dir: Path, commands: Iterable[str],
                 token: str) -> None:
        self.config = config
        self._bot = bot
        self._pairing = pairing
        self._access = Access(config, pairing)
        self._outbound = outbound
        self._media_dir = media_dir
        self._commands = [*commands, "start"]
        self._secrets = (token,)
        self._context = GroupContext(self.config.group_history, MAX_CONTEXT_CHATS)

    async def prepare(self, message: Message, me: User) -> list[InboundMessage]:
        """The messages to publish for ``message``, context first; [] when none."""
        user, chat = message.from_user, message.chat
        kind = chat_type(chat)
        if user is None or user.is_bot or kind is None:
            return []
        mentioned = False
        if kind == "direct":
            verdict = await self._access.direct(user)
        else:
            addressed = addressing(message, bot_id=me.id, bot_username=me.username or "",
                                   commands=self._commands)
            mentioned = addressed.any
            verdict = await self._access.group(chat, user, addressed=addressed.any)
        if verdict == "ignore":
            _log.info("telegram: ignored a message from user %s in chat %s (not allowed by "
                      "channels.telegram access settings)", user.id, chat.id)
            return []
        if verdict == "pair":
            await self._pairing_reply(message, user)
            return []
        text = message_text(message, bot_id=me.id, bot_username=me.username or "")
        if verdict == "context":
            ref = media_ref(message)
            shown = "\n".join(filter(None, (text, f"[{ref.label}]" if ref else "")))
            if shown:
                self._context.keep(to_inbound(message, text=shown, context_only=True))
            return []
        media, text = await self._download(message, text)
        if not text and not media:
            return []
        msg = to_inbound(message, text=text, media=media, mentioned=mentioned)
        return self._context.with_context(msg)

    async def _pairing_reply(self, message: Message, user: User) -> None:
        try:
            code = await self._pairing.request(NAME, str(user.id), user_name=display_name(user),
                                               chat_id=str(message.chat.id))
        except PairingFull:
            text = ("Hi! This bot only talks to people its owner approved, and several requests "
                    "are already waiting. Please try again in an hour.")
        else:
            if code.new:
                _log.info("telegram: pairing code %s issued to %s (id %s)", code.code,
                          display_name(user), user.id)
            text = (f"Hi {user.first_name}! I only talk to people my owner approved.\n\n"
                    f"Your pairing code: {code.code}\n\n"
                    f"Send it to my owner, who approves it with:\n"
                    f"parley pairing approve telegram {code.code}\n\n"
                    f"The code is valid for one hour. Your Telegram user id is {user.id}.")
        await self._outbound.notice(message, text)

    async def _download(self, message: Message, text: str) -> tuple[tuple[Media, ...], str]:
        """The message's file saved under ``media_dir``; over the cap, a polite refusal and a
        note for the agent instead (and nothing at all when there is no text to pass on)."""
        ref = media_ref(message)
        if ref is None:
            return (), text
        limit = self.config.max_media_bytes
        try:
            if ref.size is None or ref.size <= limit:
                file = await self._bot.get_file(ref.file_id)
                if (file.file_size or 0) <= limit:
                    data = await file.download_as_bytearray()
                    if len(data) <= limit:
                        name = f"{uuid.uuid4().hex}{file_suffix(ref, file.file_path)}"
                        path = self._media_dir / name
                        await asyncio.to_thread(_write_new, path, bytes(data))
                        return (Media(kind=ref.kind, path=str(path), mime=ref.mime,
                                      size=len(data)),), text
        except TelegramError as exc:
            _log.warning("telegram: could not download a %s: %s", ref.label,
                         redact(exc.message, self._secrets))
            note = f"[The user attached a {ref.label} that could not be downloaded.]"
            return (), "\n".join(filter(None, (text, note)))
        await self._outbound.notice(message, too_big_reply(ref, limit))
        return (), "\n".join((text, too_big_note(ref, limit))) if text else ""


def _write_new(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as fh:
        fh.write(data)
