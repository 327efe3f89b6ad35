"""Who the bot serves: the one access policy every chat platform shares, as a matrix of rules ×
messages → verdict. Telegram's rules open listed groups (``confined=False``); Discord's also
confine the bot to its listed servers and channels (``confined=True``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from channels.access import APPROVAL_TTL, Access, AccessRules
from channels.discord_convert import access_rules as discord_rules
from channels.incoming import Incoming, Sender
from channels.telegram_convert import access_rules as telegram_rules
from gateway.kernel.config import DiscordChannelConfig, TelegramChannelConfig
from gateway.kernel.pairing import PairingStore

ADA = Sender(id="1001", name="Ada Lovelace", handle="ada")
BOB = Sender(id="1002", name="Bob")
ROBOT = Sender(id="5", name="Other Bot", is_bot=True)
STRANGER = Sender(id="1", name="someone")
GROUP = "-100123"
GUILD, GENERAL, THREAD = "320000000000005000", "330000000000006000", "340000000000007000"


def direct(sender: Sender) -> Incoming:
    return Incoming(platform="chat", id="7", where=sender.id, chat_id=sender.id, direct=True,
                    sender=sender, addressed=True, text="hi",
                    received_at=datetime(2026, 3, 1, tzinfo=UTC))


def group(sender: Sender, *, addressed: bool = True, chat: str = GROUP,
          thread: str | None = None, guild: str | None = None,
          names: tuple[str, ...] = ()) -> Incoming:
    """A group message; in a thread, ``where`` is the thread and its parent a place id too."""
    where = thread or chat
    return Incoming(platform="chat", id="8", where=where, chat_id=chat, thread_id=thread,
                    guild_id=guild, place_ids=(where, *((chat,) if thread else ()), *names),
                    direct=False, sender=sender, addressed=addressed, text="hi",
                    received_at=datetime(2026, 3, 1, tzinfo=UTC))


def server(sender: Sender, *, addressed: bool = True, channel: str = GENERAL,
           thread: str | None = None, guild: str = GUILD) -> Incoming:
    return group(sender, addressed=addressed, chat=channel, thread=thread, guild=guild)


CONFINED = {"confined": True, "allow_from": [ADA.id]}
"""Discord's shape: ids only, Ada listed, and the place lists confine the bot."""

MATRIX: list[tuple[str, dict[str, Any], Incoming, str]] = [
    # direct messages follow dm_policy
    ("stranger, pairing", {}, direct(BOB), "pair"),
    ("listed by @name, any case", {"allow_from": ["@ADA"]}, direct(ADA), "serve"),
    ("listed by name without @", {"allow_from": ["ada"]}, direct(ADA), "serve"),
    ("listed by id, allowlist", {"allow_from": ["1002"], "dm_policy": "allowlist"},
     direct(BOB), "serve"),
    ("stranger, allowlist", {"dm_policy": "allowlist"}, direct(BOB), "ignore"),
    ("stranger, open", {"dm_policy": "open"}, direct(BOB), "serve"),
    ("listed, disabled", {"dm_policy": "disabled", "allow_from": ["1002"]}, direct(BOB),
     "ignore"),
    ("listed, pairing", CONFINED, direct(ADA), "serve"),
    ("stranger, pairing, ids only", CONFINED, direct(BOB), "pair"),
    ("stranger, allowlist, ids only", {**CONFINED, "dm_policy": "allowlist"},
     direct(STRANGER), "ignore"),
    ("stranger, open, ids only", {**CONFINED, "dm_policy": "open"}, direct(STRANGER),
     "serve"),
    ("listed, disabled, ids only", {**CONFINED, "dm_policy": "disabled"}, direct(ADA),
     "ignore"),
    # groups: strangers only in listed places; what is not answered is context
    ("stranger addresses", {}, group(BOB), "context"),
    ("stranger addresses, no history", {"group_history": 0}, group(BOB), "ignore"),
    ("stranger in a listed group", {"allow_places": [GROUP]}, group(BOB), "serve"),
    ("listed group by @name", {"allow_places": ["@Friends"]},
     group(BOB, names=("@friends",)), "serve"),
    ("listed user, not addressed", {"allow_from": ["1002"]}, group(BOB, addressed=False),
     "context"),
    ("listed user, open, not addressed", {"allow_from": ["1002"], "group_policy": "open"},
     group(BOB, addressed=False), "serve"),
    ("listed group, disabled", {"allow_places": [GROUP], "group_policy": "disabled"},
     group(BOB), "ignore"),
    ("unconfined: other groups stay open to listed users",
     {"allow_places": ["-1"], "allow_from": ["1001"]}, group(ADA), "serve"),
    # servers: the lists confine the bot, a thread goes with its parent
    ("listed user addresses", CONFINED, server(ADA), "serve"),
    ("stranger addresses a server", CONFINED, server(BOB), "context"),
    ("listed user, not addressed, server", CONFINED, server(ADA, addressed=False), "context"),
    ("no history, server", {**CONFINED, "group_history": 0}, server(ADA, addressed=False),
     "ignore"),
    ("stranger in a listed channel's thread", {**CONFINED, "allow_places": [GENERAL]},
     server(BOB, thread=THREAD), "serve"),
    ("outside allow_channels", {**CONFINED, "allow_places": [GENERAL]},
     server(ADA, channel="1"), "ignore"),
    ("outside allow_guilds", {**CONFINED, "allow_guilds": ["1"]}, server(ADA), "ignore"),
    ("open, listed server, stranger", {**CONFINED, "group_policy": "open",
                                       "allow_guilds": [GUILD]},
     server(BOB, addressed=False), "serve"),
    ("open never answers every bot line", {**CONFINED, "group_policy": "open",
                                           "allow_guilds": [GUILD]},
     server(ROBOT, addressed=False), "context"),
    ("a bot that addresses it", {**CONFINED, "group_policy": "open", "allow_guilds": [GUILD]},
     server(ROBOT), "serve"),
    ("server, disabled", {**CONFINED, "group_policy": "disabled"}, server(ADA), "ignore"),
]


def rules(**settings: Any) -> AccessRules:
    defaults: dict[str, Any] = {"dm_policy": "pairing", "group_policy": "mention",
                                "group_history": 20, "allow_from": []}
    return AccessRules.of(**{**defaults, **settings})


@pytest.mark.parametrize(("settings", "message", "expected"),
                         [row[1:] for row in MATRIX], ids=[row[0] for row in MATRIX])
async def test_access_matrix(pairing: PairingStore, settings: dict[str, Any],
                             message: Incoming, expected: str) -> None:
    access = Access("chat", rules(**settings), pairing)
    assert await access.verdict(message) == expected


async def test_an_approval_counts_at_once(pairing: PairingStore) -> None:
    access = Access("chat", rules(), pairing)
    assert await access.verdict(direct(BOB)) == "pair"
    code = await pairing.request("chat", BOB.id)
    await pairing.approve("chat", code.code)
    assert await access.verdict(direct(BOB)) == "serve"  # approved by the owner: no restart
    assert await access.verdict(group(BOB)) == "serve"  # and may address it in groups
    assert await access.trust(BOB) == "member"


async def test_a_revoked_approval_ends_within_the_ttl(pairing: PairingStore) -> None:
    now = [0.0]
    access = Access("chat", rules(), pairing, monotonic=lambda: now[0])
    code = await pairing.request("chat", BOB.id)
    await pairing.approve("chat", code.code)
    assert await access.verdict(direct(BOB)) == "serve"
    assert await pairing.revoke("chat", BOB.id)  # `parley pairing revoke`, another process
    assert not await pairing.revoke("chat", BOB.id)
    assert await access.verdict(direct(BOB)) == "serve"  # believed for APPROVAL_TTL
    now[0] += APPROVAL_TTL
    assert await access.verdict(direct(BOB)) == "pair"
    assert await access.trust(BOB) == "guest"


@pytest.mark.parametrize(("settings", "sender", "verdict", "trust"), [
    ({"allow_from": ["@ada"]}, ADA, "serve", "owner"),
    ({"allow_from": [ADA.id], "members": [BOB.id]}, BOB, "serve", "member"),
    ({"allow_from": [ADA.id], "members": ["@ada"]}, ADA, "serve", "owner"),
    ({"members": [BOB.id], "dm_policy": "allowlist"}, BOB, "serve", "member"),
    ({"dm_policy": "open"}, STRANGER, "serve", "guest"),
    ({"dm_policy": "open", "members": [BOB.id]}, BOB, "serve", "member"),
], ids=["owner by name", "listed member", "owner wins over member", "member under allowlist",
        "open dm: a guest", "open dm: a listed member stays a member"])
async def test_trust_of_who_is_served(pairing: PairingStore, settings: dict[str, Any],
                                      sender: Sender, verdict: str, trust: str) -> None:
    access = Access("chat", rules(**settings), pairing)
    assert await access.verdict(direct(sender)) == verdict
    assert await access.trust(sender) == trust


async def test_anyone_in_an_open_place_is_a_guest(pairing: PairingStore) -> None:
    access = Access("chat", rules(allow_from=[ADA.id], allow_places=[GROUP]), pairing)
    assert await access.verdict(group(STRANGER)) == "serve"
    assert await access.trust(STRANGER) == "guest"
    assert await access.trust(ADA) == "owner"


def test_each_platform_config_maps_to_rules() -> None:
    telegram = telegram_rules(TelegramChannelConfig(allow_from=["123", "@Ada"],
                                                    members=["@Bob"], allow_groups=["-100123"]))
    assert telegram.users == {"123", "@ada"} and telegram.places == {"-100123"}
    assert telegram.members == {"@bob"}
    assert not telegram.confined and telegram.dm_policy == "pairing"
    discord = discord_rules(DiscordChannelConfig(allow_from=["1"], allow_guilds=["2"],
                                                 allow_channels=["3"], group_history=0))
    assert (discord.users, discord.guilds, discord.places) == ({"1"}, {"2"}, {"3"})
    assert discord.confined and discord.group_history == 0
