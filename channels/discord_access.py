"""Who the Discord bot serves.

Direct messages follow ``dm_policy``: ``open`` (anyone), ``allowlist`` (``allow_from`` only),
``pairing`` (``allow_from`` plus users the owner approved with ``parley pairing approve
discord CODE``; strangers get a code) or ``disabled``.

Server messages follow ``group_policy``: ``mention`` (answer when mentioned or replied to),
``open`` (answer everything) or ``disabled``. ``allow_guilds`` and ``allow_channels``, when
set, confine the bot to those servers and channels (a thread goes with its parent), and there
anyone may address it; without them it answers only people it would serve in a direct message,
so a stranger cannot invite the bot to a server and spend the owner's model budget. Messages it
does not answer in a place it may speak are kept as context when ``group_history`` is above 0.
"""

from __future__ import annotations

from typing import Literal

from channels.discord_convert import NAME, Incoming
from gateway.kernel.config import DiscordChannelConfig
from gateway.kernel.pairing import PairingStore

Verdict = Literal["serve", "context", "pair", "ignore"]


class Access:
    def __init__(self, config: DiscordChannelConfig, pairing: PairingStore) -> None:
        self.config = config
        self.pairing = pairing
        self._users = set(config.allow_from)
        self._guilds = set(config.allow_guilds)
        self._channels = set(config.allow_channels)
        self._approved: set[str] = set()
        """Users the owner approved: positives only, read again from SQLite until approved."""

    def place_allowed(self, inc: Incoming) -> bool:
        """Not outside ``allow_guilds`` / ``allow_channels`` (when they are set)."""
        if self._guilds and inc.guild_id not in self._guilds:
            return False
        return not self._channels or self._channel_listed(inc)

    def _channel_listed(self, inc: Incoming) -> bool:
        return inc.channel_id in self._channels or inc.parent_id in self._channels

    def place_listed(self, inc: Incoming) -> bool:
        """A server or channel the owner opened to everyone in it."""
        return inc.guild_id in self._guilds or self._channel_listed(inc)

    async def sender_allowed(self, user_id: str) -> bool:
        """Would this user be served in a direct message?"""
        if self.config.dm_policy == "open" or user_id in self._users:
            return True
        if self.config.dm_policy != "pairing":
            return False
        if user_id in self._approved:
            return True
        if await self.pairing.is_approved(NAME, user_id):
            self._approved.add(user_id)
            return True
        return False

    async def direct(self, user_id: str) -> Verdict:
        if self.config.dm_policy == "disabled":
            return "ignore"
        if await self.sender_allowed(user_id):
            return "serve"
        return "pair" if self.config.dm_policy == "pairing" else "ignore"

    async def guild(self, inc: Incoming, *, addressed: bool) -> Verdict:
        if self.config.group_policy == "disabled" or not self.place_allowed(inc):
            return "ignore"
        keep: Verdict = "context" if self.config.group_history > 0 else "ignore"
        # Another bot never gets an answer to everything it says (``open``): two bots would
        # answer each other forever.
        open_to_all = self.config.group_policy == "open" and not inc.author_is_bot
        if not (addressed or open_to_all):
            return keep
        if self.place_listed(inc) or await self.sender_allowed(inc.author_id):
            return "serve"
        return keep
