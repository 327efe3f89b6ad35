"""Who a chat bot serves, the same rules on every platform.

Direct messages follow ``dm_policy``: ``open`` (anyone), ``allowlist`` (``allow_from`` only),
``pairing`` (``allow_from`` plus users the owner approved with ``parley pairing approve``;
strangers get a code) or ``disabled``.

Group messages follow ``group_policy``: ``mention`` (answer when addressed: mentioned, replied
to, or sent one of our commands), ``open`` (answer everything, but never every line of another
bot: two bots would answer each other forever) or ``disabled``. In a listed place (Telegram's
``allow_groups``; Discord's ``allow_guilds`` and ``allow_channels``, a thread going with its
parent) everyone may address the bot; elsewhere only people it would serve in a direct message
may, so a stranger cannot add the bot to a group and spend the owner's model budget. Where the
lists also *confine* the bot (Discord), it says nothing at all outside them. Messages it does
not answer in a place it may speak are kept as context when ``group_history`` is above 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Literal

from channels.incoming import Incoming, Sender
from gateway.kernel.events import Trust
from gateway.kernel.frozen import frozen
from gateway.kernel.pairing import PairingStore

Verdict = Literal["serve", "context", "pair", "ignore"]
DmPolicy = Literal["pairing", "allowlist", "open", "disabled"]
GroupPolicy = Literal["mention", "open", "disabled"]
APPROVAL_TTL = 60.0
"""Seconds an approval read from SQLite is believed before it is read again."""


def listed(entry: str) -> str:
    """How an allow-list entry is compared: ids as they are, names as ``@name`` in lower case
    (``@Ada``, ``ada`` and ``@ada`` are one user)."""
    entry = entry.strip()
    return entry if entry.lstrip("-").isdigit() else "@" + entry.lstrip("@").lower()


def _keys(entries: Iterable[str]) -> frozenset[str]:
    return frozenset(listed(e) for e in entries if e.strip())


@frozen(kw_only=True)
class AccessRules:
    dm_policy: DmPolicy = "pairing"
    group_policy: GroupPolicy = "mention"
    group_history: int = 20
    users: frozenset[str] = frozenset()
    """The owner's ids and names (``allow_from``)."""
    members: frozenset[str] = frozenset()
    places: frozenset[str] = frozenset()
    """Chats or channels opened to everyone in them (a thread goes with its parent)."""
    guilds: frozenset[str] = frozenset()
    """Servers opened to everyone in them."""
    confined: bool = False
    """The lists, when set, are the only places the bot speaks in."""

    @classmethod
    def of(cls, *, dm_policy: DmPolicy, group_policy: GroupPolicy, group_history: int,
           allow_from: Iterable[str], members: Iterable[str] = (),
           allow_places: Iterable[str] = (), allow_guilds: Iterable[str] = (),
           confined: bool = False) -> AccessRules:
        return cls(dm_policy=dm_policy, group_policy=group_policy, group_history=group_history,
                   users=_keys(allow_from), members=_keys(members), places=_keys(allow_places),
                   guilds=_keys(allow_guilds), confined=confined)


class Access:
    def __init__(self, platform: str, rules: AccessRules, pairing: PairingStore, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.platform = platform
        self.rules = rules
        self.pairing = pairing
        self._approved: dict[str, float] = {}
        """Users the owner approved → when that was read: positives only, read again from
        SQLite after ``APPROVAL_TTL`` (so ``parley pairing revoke`` takes effect) and until
        approved."""
        self.monotonic = monotonic

    async def verdict(self, inc: Incoming) -> Verdict:
        return await self.direct(inc.sender) if inc.direct else await self.group(inc)

    def listed(self, sender: Sender, among: frozenset[str] | None = None) -> bool:
        """In ``allow_from`` (or in ``among``)."""
        users = self.rules.users if among is None else among
        return sender.id in users or (sender.handle is not None and
                                      listed(sender.handle) in users)

    async def trust(self, sender: Sender) -> Trust:
        """How far a served sender is trusted: listed owner, member, or guest."""
        if self.listed(sender):
            return "owner"
        if self.listed(sender, self.rules.members) or await self._paired(sender):
            return "member"
        return "guest"

    async def sender_allowed(self, sender: Sender) -> bool:
        """Would this user be served in a direct message?"""
        rules = self.rules
        if rules.dm_policy == "open" or self.listed(sender) or \
                self.listed(sender, rules.members):
            return True
        return rules.dm_policy == "pairing" and await self._paired(sender)

    async def _paired(self, sender: Sender) -> bool:
        now = self.monotonic()
        if now - self._approved.get(sender.id, -APPROVAL_TTL) < APPROVAL_TTL:
            return True
        if await self.pairing.is_approved(self.platform, sender.id):
            self._approved[sender.id] = now
            return True
        self._approved.pop(sender.id, None)
        return False

    async def direct(self, sender: Sender) -> Verdict:
        if self.rules.dm_policy == "disabled":
            return "ignore"
        if await self.sender_allowed(sender):
            return "serve"
        return "pair" if self.rules.dm_policy == "pairing" else "ignore"

    async def group(self, inc: Incoming) -> Verdict:
        rules = self.rules
        if rules.group_policy == "disabled" or not self.place_allowed(inc):
            return "ignore"
        keep: Verdict = "context" if rules.group_history > 0 else "ignore"
        open_to_all = rules.group_policy == "open" and not inc.sender.is_bot
        if not (inc.addressed or open_to_all):
            return keep
        if self.place_listed(inc) or await self.sender_allowed(inc.sender):
            return "serve"
        return keep

    def place_allowed(self, inc: Incoming) -> bool:
        """Not outside the lists that confine the bot (when they are set)."""
        rules = self.rules
        if not rules.confined:
            return True
        if rules.guilds and inc.guild_id not in rules.guilds:
            return False
        return not rules.places or self._place_named(inc)

    def place_listed(self, inc: Incoming) -> bool:
        """A place the owner opened to everyone in it."""
        return inc.guild_id in self.rules.guilds or self._place_named(inc)

    def _place_named(self, inc: Incoming) -> bool:
        return any(listed(p) in self.rules.places for p in inc.place_ids if p)
