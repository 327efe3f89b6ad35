"""Discord input, the transport's part: which messages reach the shared inbound pipeline, once
each and in order.

discord.py hands over messages in tasks of their own; ``put()`` queues them and ``run()``, one
worker, converts each (looking up a thread's parent when discord.py does not know it) and hands
it to ``channels.inbound`` — one that could not be stored is tried again before the next, as
Discord never offers a message twice. Message ids already handled are remembered (a replay or
a read-back never answers twice), and so is the last message of each recently active channel, for
``catch_up()``: after a session Discord could not resume, or a restart, what was said since is
read back over REST.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from channels.discord_convert import describe, discord, incoming
from channels.discord_cursors import Cursor, Cursors
from channels.discord_outbound import SEND_ERRORS
from channels.inbound import Inbound
from channels.incoming import Incoming

_log = logging.getLogger(__name__)

MAX_SEEN = 10_000
MAX_CURSORS = 50
CATCH_UP_LIMIT = 50


class Reader:
    def __init__(self, inbound: Inbound, *, client: Callable[[], discord.Client | None],
                 on_handled: Callable[[], Awaitable[None]],
                 cursors: Cursors | None = None) -> None:
        """``client()``: the logged-in client or None; ``on_handled`` after each message;
        ``cursors``: where each channel's reading is kept across restarts."""
        self._inbound = inbound
        self._client = client
        self._on_handled = on_handled
        self._queue: asyncio.Queue[discord.Message] = asyncio.Queue()
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._cursors: OrderedDict[int, Cursor] = OrderedDict()
        """Channel id → (guild id, last message id handled there)."""
        self._cursor_store = cursors
        self._parents: dict[int, int | None] = {}

    # --- the worker -----------------------------------------------------------------------------

    def put(self, message: discord.Message) -> None:
        self._queue.put_nowait(message)

    async def run(self) -> None:
        while True:
            await self.handle(await self._queue.get())

    async def handle(self, message: discord.Message) -> None:
        client = self._client()
        me = client.user if client is not None else None
        if message.id in self._seen or me is None:
            return
        while not await self._inbound.take(self._incoming(message, str(me.id)),
                                           f"message {message.id}"):
            if self._inbound.closed:
                return  # stopping: the bus takes nothing more, a restart reads it back
            # Not stored (each take tried a few times, waiting between): Discord would not
            # offer it again, so it is tried until it is stored, the ones after it waiting.
        self._remember(message)
        await self._save_cursor(message)
        await self._on_handled()

    async def _incoming(self, message: discord.Message, bot_id: str) -> Incoming | None:
        parent = await self._parent_of(message)
        return incoming(describe(message, parent_id=parent), bot_id=bot_id,
                        bot_roles=_bot_roles(message.guild))

    async def restore(self) -> bool:
        """Load where reading stopped before a restart; True when there is anything to read
        back (then ``catch_up()`` on the first session)."""
        if self._cursor_store is None:
            return False
        await self._cursor_store.setup()
        for channel_id, cursor in (await self._cursor_store.load(MAX_CURSORS)).items():
            known = self._cursors.get(channel_id)
            if known is None or known[1] < cursor[1]:
                self._cursors[channel_id] = cursor
        return bool(self._cursors)

    async def _save_cursor(self, message: discord.Message) -> None:
        if self._cursor_store is None:
            return
        guild_id = message.guild.id if message.guild is not None else None
        try:
            await self._cursor_store.save(message.channel.id, guild_id, message.id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the message itself is stored; only a restart's read-back
            _log.warning("discord: could not record the read position of channel %s: %s",
                         message.channel.id, exc)

    async def catch_up(self) -> None:
        """Queue what was said, after the last message handled, in recently active channels."""
        client = self._client()
        if client is None:
            return
        for channel_id, (guild_id, after) in list(self._cursors.items()):
            where = client.get_partial_messageable(channel_id, guild_id=guild_id)
            try:
                async for message in where.history(after=discord.Object(after),
                                                   limit=CATCH_UP_LIMIT, oldest_first=True):
                    self.put(message)
            except SEND_ERRORS as exc:
                _log.warning("discord: could not read back channel %s: %s", channel_id, exc)

    def _remember(self, message: discord.Message) -> None:
        self._seen[message.id] = None
        while len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        channel_id = message.channel.id
        guild_id = message.guild.id if message.guild is not None else None
        known = self._cursors.get(channel_id)
        if known is None or known[1] < message.id:
            self._cursors[channel_id] = (guild_id, message.id)
            self._cursors.move_to_end(channel_id)
            while len(self._cursors) > MAX_CURSORS:
                self._cursors.popitem(last=False)

    async def _parent_of(self, message: discord.Message) -> int | None:
        """The parent channel of a thread message (looked up once when not cached); None
        outside threads."""
        channel, guild = message.channel, message.guild
        if isinstance(channel, discord.Thread):
            return channel.parent_id
        if guild is None or not isinstance(channel, discord.PartialMessageable):
            return None
        found = guild.get_channel_or_thread(channel.id)
        if found is not None:
            return found.parent_id if isinstance(found, discord.Thread) else None
        if channel.id not in self._parents:
            client = self._client()
            if client is None:
                return None
            try:
                fetched = await client.fetch_channel(channel.id)
            except SEND_ERRORS as exc:
                _log.warning("discord: could not look up channel %s: %s", channel.id, exc)
                return None
            self._parents[channel.id] = fetched.parent_id \
                if isinstance(fetched, discord.Thread) else None
        return self._parents[channel.id]


def _bot_roles(guild: discord.Guild | None) -> frozenset[str]:
    """Roles whose mention addresses the bot: its own managed role and those it holds."""
    if guild is None:
        return frozenset()
    roles = {str(r.id) for r in guild.me.roles if not r.is_default()} \
        if guild.me is not None else set()
    if guild.self_role is not None:
        roles.add(str(guild.self_role.id))
    return frozenset(roles)
