"""What the Discord channel needs to know about discord.py itself: where it sends requests
(class attributes, global to the process), the intents it asks for, and the heartbeat
bookkeeping it keeps without a public hook; and its client, with the events the channel
wants handed over."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import yarl

from channels.discord_convert import allowed_mentions, discord
from gateway.kernel.config import DiscordChannelConfig

_log = logging.getLogger("channels.discord")

IDENTIFY_DELAY = 5.0
"""Seconds to wait before an IDENTIFY that is not the first (Discord allows one per 5 s)."""

Route = discord.http.Route
DiscordWebSocket = discord.gateway.DiscordWebSocket
DEFAULT_API_BASE = Route.BASE
DEFAULT_GATEWAY = DiscordWebSocket.DEFAULT_GATEWAY
PORTAL_SWITCH = (
    "Discord refused the privileged Message Content intent. Open "
    "https://discord.com/developers/applications → your application → Bot → Privileged "
    "Gateway Intents, switch on MESSAGE CONTENT INTENT, save, and start the gateway again")


def gateway_intents() -> discord.Intents:
    """Server messages, DMs and their content (privileged: the portal switch must be on)."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True
    return intents


_POINTING: set[object] = set()
"""The channels the library points elsewhere for (``by``): the defaults come back when the
last one lets go (two channels of one bot in one process: the several-process tests)."""


def point_library_at(api_base: str, gateway: yarl.URL, *, by: object = None) -> None:
    """discord.py's REST base and gateway URL: class attributes, global to the process."""
    Route.BASE = api_base
    DiscordWebSocket.DEFAULT_GATEWAY = gateway
    if by is not None:
        _POINTING.add(by)


def let_go_of_library(by: object) -> None:
    """``by`` no longer needs the library pointed elsewhere: the defaults, once nobody does."""
    _POINTING.discard(by)
    if not _POINTING:
        point_library_at(DEFAULT_API_BASE, DEFAULT_GATEWAY)


def heartbeat_ack_age(client: discord.Client) -> float | None:
    """Seconds since the gateway last acknowledged a heartbeat; None when not connected.

    discord.py keeps this on its keep-alive thread and offers no public hook for it.
    """
    keep_alive = getattr(client.ws, "_keep_alive", None) if client.ws is not None else None
    last = getattr(keep_alive, "_last_ack", None)
    return time.perf_counter() - last if isinstance(last, float) else None


async def close_client(client: discord.Client) -> None:
    """Close the client (bounded), and what discord.py leaves behind when it closes early."""
    try:
        async with asyncio.timeout(10.0):
            await client.close()
    except Exception:
        _log.exception("discord: client did not close cleanly")
    # discord.py leaves its READY bookkeeping task (``_delay_ready``, waiting for more
    # GUILD_CREATEs) pending when the client closes within seconds of connecting.
    ready_task = getattr(client._connection, "_ready_task", None)
    if isinstance(ready_task, asyncio.Task):
        ready_task.cancel()


class Owner(Protocol):
    """What the client hands its events to (the channel)."""

    async def _gateway_up(self, *, resumed: bool) -> None: ...

    async def _gateway_down(self) -> None: ...

    def _received(self, message: discord.Message) -> None: ...

    def _saw_event(self) -> None: ...


class Client(discord.Client):
    """discord.py's client with its events handed to the channel."""

    def __init__(self, owner: Owner, **options: Any) -> None:
        super().__init__(**options)
        self._owner = owner

    @classmethod
    def of(cls, owner: Owner, config: DiscordChannelConfig) -> Client:
        """The channel's client: its intents, no guild chunking, the mentions it allows."""
        # No voice here: skip discord.py's "PyNaCl / davey is not installed" warnings.
        discord.VoiceClient.warn_nacl = False
        discord.VoiceClient.warn_dave = False
        return cls(owner, intents=gateway_intents(), chunk_guilds_at_startup=False,
                   allowed_mentions=allowed_mentions(allow_mentions=config.allow_mentions,
                                                     reply_ping=config.reply_ping))

    async def before_identify_hook(self, shard_id: int | None, *,
                                   initial: bool = False) -> None:
        if not initial:
            await asyncio.sleep(IDENTIFY_DELAY)

    async def on_connect(self) -> None:
        await self._owner._gateway_up(resumed=False)

    async def on_resumed(self) -> None:
        await self._owner._gateway_up(resumed=True)

    async def on_disconnect(self) -> None:
        await self._owner._gateway_down()

    async def on_message(self, message: discord.Message) -> None:
        self._owner._received(message)

    async def on_socket_event_type(self, event_type: str) -> None:
        self._owner._saw_event()
