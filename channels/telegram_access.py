"""Who the Telegram bot serves.

Direct messages follow ``dm_policy``: ``open`` (anyone), ``allowlist`` (``allow_from`` only),
``pairing`` (``allow_from`` plus users the owner approved with ``parley pairing approve``;
strangers get a code) or ``disabled``.

Groups follow ``group_policy``: ``mention`` (answer when @mentioned, replied to, or sent one of
our commands), ``open`` (answer everything) or ``disabled``. In a group listed in
``allow_groups`` everyone may address the bot; in any other group only people the bot would
serve in a direct message may (so a stranger cannot add the bot to a group and spend the
owner's model budget). Messages the bot does not answer are kept as context when
``group_history`` is above 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from telegram import Chat, User

from gateway.kernel.config import TelegramChannelConfig
from gateway.kernel.pairing import PairingStore

Verdict = Literal["serve", "context", "pair", "ignore"]

CHANNEL = "telegram"


def _usernames(entries: Iterable[str]) -> set[str]:
    return {e.strip().lstrip("@").lower() for e in entries
            if e.strip() and not e.strip().lstrip("-").isdigit()}


def _ids(entries: Iterable[str]) -> set[str]:
    return {e.strip() for e in entries if e.strip().lstrip("-").isdigit()}


class Access:
    def __init__(self, config: TelegramChannelConfig, pairing: PairingStore) -> None:
        self.config = config
        self.pairing = pairing
        self._user_ids = _ids(config.allow_from)
        self._user_names = _usernames(config.allow_from)
        self._group_ids = _ids(config.allow_groups)
        self._group_names = _usernames(config.allow_groups)
        self._approved: set[str] = set()
        """Users the owner approved: positives only, read again from SQLite until approved."""

    def listed(self, user: User) -> bool:
        return str(user.id) in self._user_ids or (
            user.username is not None and user.username.lower() in self._user_names)

    def group_listed(self, chat: Chat) -> bool:
        return str(chat.id) in self._group_ids or (
            chat.username is not None and chat.username.lower() in self._group_names)

    async def sender_allowed(self, user: User) -> bool:
        """Would this user be served in a direct message?"""
        if self.config.dm_policy == "open" or self.listed(user):
            return True
        if self.config.dm_policy != "pairing":
            return False
        key = str(user.id)
        if key in self._approved:
            return True
        if await self.pairing.is_approved(CHANNEL, key):
            self._approved.add(key)
            return True
        return False

    async def direct(self, user: User) -> Verdict:
        if self.config.dm_policy == "disabled":
            return "ignore"
        if await self.sender_allowed(user):
            return "serve"
        return "pair" if self.config.dm_policy == "pairing" else "ignore"

    async def group(self, chat: Chat, user: User, *, addressed: bool) -> Verdict:
        if self.config.group_policy == "disabled":
            return "ignore"
        keep: Verdict = "context" if self.config.group_history > 0 else "ignore"
        if not (addressed or self.config.group_policy == "open"):
            return keep
        if self.group_listed(chat) or await self.sender_allowed(user):
            return "serve"
        return keep
