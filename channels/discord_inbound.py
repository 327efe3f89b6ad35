"""Discord input: one message → access check → pairing, context, or messages for the bus.

discord.py hands over messages in tasks of their own; ``put()`` queues them and ``run()``, one
worker, handles them in arrival order and publishes what ``prepare()`` returns. Message ids
already handled are remembered (a replay or a read-back never answers twice), and so is the
last message of each recently active channel, for ``catch_up()``: after a session Discord could
not resume, what was said since is read back over REST.

Server messages the bot does not answer wait in memory (at most ``group_history`` per channel
or thread) and go to the bus as context-only messages right before the next message it answers
there, so the agent sees what was said when it is addressed. Attachments are saved under the
workspace's ``inbox/``: pictures reach the model as images, other files by path; a file over
``max_media_bytes`` gets a polite refusal in the chat and a note for the agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from channels.common import GroupContext
from channels.discord_access import Access
from channels.discord_convert import (
    NAME,
    AttachmentRef,
    Incoming,
    addressing,
    attachment_mime,
    describe,
    discord,
    media_kind,
    message_text,
    stored_name,
    to_inbound,
    too_big_note,
    too_big_reply,
)
from channels.discord_cursors import Cursor, Cursors
from channels.discord_outbound import SEND_ERRORS, Backoff, Outbound
from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.config import DiscordChannelConfig
from gateway.kernel.events import InboundMessage, Media, utcnow
from gateway.kernel.pairing import PairingFull, PairingStore

_log = logging.getLogger(__name__)

MAX_CONTEXT_CHATS = 200
MAX_SEEN = 10_000
MAX_CURSORS = 50
CATCH_UP_LIMIT = 50
PUBLISH_ATTEMPTS = 5


class Inbound:
    def __init__(self, config: DiscordChannelConfig, *, bus: MessageBus, pairing: PairingStore,
                 outbound: Outbound, client: Callable[[], discord.Client | None],
                 inbox_dir: Path, on_handled: Callable[[], Awaitable[None]],
                 cursors: Cursors | None = None) -> None:
        """``client()``: the logged-in client or None; ``on_handled`` after each message;
        ``cursors``: where each channel's reading is kept across restarts."""
        self.config = config
        self._bus = bus
        self._pairing = pairing
        self._access = Access(config, pairing)
        self._outbound = outbound
        self._client = client
        self._inbox = inbox_dir
        self._on_handled = on_handled
        self._queue: asyncio.Queue[discord.Message] = asyncio.Queue()
        self._context = GroupContext(self.config.group_history, MAX_CONTEXT_CHATS)
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._cursors: OrderedDict[int, Cursor] = OrderedDict()
        """Channel id → (guild id, last message id handled there)."""
        self._cursor_store = cursors
        self._parents: dict[int, int | None] = {}
        self.last_inbound: datetime | None = None

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
        try:
            parent = await self._parent_of(message)
            ready = await self.prepare(describe(message, parent_id=parent), bot_id=str(me.id),
                                       bot_roles=_bot_roles(message.guild))
        except asyncio.CancelledError:
            raise
        except Exception:  # our bug, or a message we cannot read: skip it, do not loop on it
            _log.exception("discord: could not handle message %s", message.id)
            ready = []
        for msg in ready:
            if not await self._publish(msg):
                return  # stopping: the bus takes nothing more
        self._remember(message)
        await self._save_cursor(message)
        if ready:
            self.last_inbound = utcnow()
        await self._on_handled()

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

    async def _publish(self, msg: InboundMessage) -> bool:
        """Store the message (a few tries); False when the bus is closed."""
        backoff = Backoff()
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                await self._bus.publish_inbound(msg)
                return True
            except BusClosed:
                return False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == PUBLISH_ATTEMPTS:
                    _log.error("discord: message %s dropped after %d failed attempts to store "
                               "it: %s", msg.message_id, attempt, exc)
                    break
                delay = backoff.next()
                _log.warning("discord: message %s not stored (%s); retry in %.1fs",
                             msg.message_id, exc, delay)
                await asyncio.sleep(delay)
        return True

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

    # --- one message ----------------------------------------------------------------------------

    async def prepare(self, inc: Incoming, *, bot_id: str,
                      bot_roles: frozenset[str] = frozenset()) -> list[InboundMessage]:
        """The messages to publish for ``inc``, context first; [] when none."""
        if inc.author_id == bot_id or inc.system:
            return []
        if inc.author_is_bot and not self.config.allow_bots:
            return []
        mentioned = False
        if inc.direct:
            verdict = await self._access.direct(inc.author_id)
        else:
            addressed = addressing(inc, bot_id=bot_id, bot_roles=bot_roles)
            mentioned = addressed.any
            verdict = await self._access.guild(inc, addressed=addressed.any)
        if verdict == "ignore":
            _log.info("discord: ignored a message from user %s in channel %s (not allowed by "
                      "channels.discord access settings)", inc.author_id, inc.channel_id)
            return []
        if verdict == "pair":
            await self._pairing_reply(inc)
            return []
        text = message_text(inc, bot_id=bot_id, bot_roles=bot_roles)
        if verdict == "context":
            files = [f"[attached {a.filename}]" for a in inc.attachments]
            shown = "\n".join(filter(None, (text, *files)))
            if shown:
                self._context.keep(to_inbound(inc, text=shown, context_only=True))
            return []
        media, text = await self._attachments(inc, text)
        if not text and not media:
            return []
        msg = to_inbound(inc, text=text, media=media, mentioned=mentioned)
        return self._context.with_context(msg)

    async def _pairing_reply(self, inc: Incoming) -> None:
        try:
            code = await self._pairing.request(NAME, inc.author_id, user_name=inc.author_name,
                                               chat_id=inc.channel_id)
        except PairingFull:
            text = ("Hi! This bot only talks to people its owner approved, and several requests "
                    "are already waiting. Please try again in an hour.")
        else:
            if code.new:
                _log.info("discord: pairing code %s issued to %s (id %s)", code.code,
                          inc.author_name, inc.author_id)
            text = (f"Hi {inc.author_name}! I only talk to people my owner approved.\n\n"
                    f"Your pairing code: {code.code}\n\n"
                    f"Send it to my owner, who approves it with:\n"
                    f"`parley pairing approve discord {code.code}`\n\n"
                    f"The code is valid for one hour. Your Discord user id is {inc.author_id}.")
        await self._outbound.notice(inc.channel_id, None, text)

    async def _attachments(self, inc: Incoming, text: str) -> tuple[tuple[Media, ...], str]:
        """Files saved under ``inbox/``; those over the cap refused politely, with a note for
        the agent (and nothing at all when nothing else is left to pass on)."""
        limit = self.config.max_media_bytes
        media: list[Media] = []
        notes: list[str] = []
        refused: list[AttachmentRef] = []
        for index, ref in enumerate(inc.attachments):
            if ref.size > limit:
                refused.append(ref)
                notes.append(too_big_note(ref, limit))
                continue
            try:
                data = await self._download(ref)
            except SEND_ERRORS as exc:
                _log.warning("discord: could not download attachment %s: %s", ref.filename, exc)
                notes.append(f'[The user attached "{ref.filename}", which could not be '
                             "downloaded.]")
                continue
            path = self._inbox / stored_name(inc.id, index, ref.filename)
            await asyncio.to_thread(_write, path, data)
            mime = attachment_mime(ref)
            media.append(Media(kind=media_kind(mime), path=str(path), mime=mime,
                               size=len(data)))
        if refused:
            await self._outbound.notice(inc.channel_id, inc.id,
                                        too_big_reply(refused, limit))
        if not text and not media:
            return (), ""
        return tuple(media), "\n".join(filter(None, (text, *notes)))


    async def _download(self, ref: AttachmentRef) -> bytes:
        client = self._client()
        if client is None:
            raise discord.ClientException("not logged in to Discord")
        return await client.http.get_from_cdn(ref.url)


def _bot_roles(guild: discord.Guild | None) -> frozenset[str]:
    """Roles whose mention addresses the bot: its own managed role and those it holds."""
    if guild is None:
        return frozenset()
    roles = {str(r.id) for r in guild.me.roles if not r.is_default()} \
        if guild.me is not None else set()
    if guild.self_role is not None:
        roles.add(str(guild.self_role.id))
    return frozenset(roles)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
