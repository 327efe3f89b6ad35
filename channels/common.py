"""Pieces every platform adapter needs: keeping bot tokens out of logs and error texts, the
backoff between reconnects, the group chatter kept as context, and waiting for a change of
state."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Self

from gateway.kernel.backoff import Backoff as Backoff  # the kernel's policy, re-exported
from gateway.kernel.events import InboundMessage


class StateWatch:
    """A mixin: ``_notify()`` after each change of state (connected, polled, message handled),
    ``wait_until(predicate)`` for ``start()`` and tests, which never sleep to find out."""

    _changed: asyncio.Condition

    async def wait_until(self, predicate: Callable[[Self], bool],
                         timeout: float = 10.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[token]")
    return text


class SecretFilter(logging.Filter):
    """Rewrites log records that contain a secret (Telegram puts the bot token in every API
    URL; discord.py logs gateway payloads)."""

    def __init__(self, *secrets: str) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True


class GroupContext:
    """Group messages not addressed to the bot, kept (the last ``per_chat`` per chat or
    thread, for at most ``max_chats`` chats) until the next addressed message, which takes
    them along as context-only history."""

    def __init__(self, per_chat: int, max_chats: int) -> None:
        self.per_chat = per_chat
        self.max_chats = max_chats
        self._kept: OrderedDict[tuple[str, str | None], deque[InboundMessage]] = OrderedDict()

    def keep(self, msg: InboundMessage) -> None:
        key = (msg.chat_id, msg.thread_id)
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = deque(maxlen=self.per_chat)
            while len(self._kept) > self.max_chats:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        kept.append(msg)

    def with_context(self, msg: InboundMessage) -> list[InboundMessage]:
        """What to publish for an addressed message: the kept context first, then it."""
        return [*self._kept.pop((msg.chat_id, msg.thread_id), ()), msg]
