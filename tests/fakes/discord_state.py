"""The fake Discord's world: users, guilds, channels and messages, the session's event log
(what ``dispatch`` sends, kept for a RESUME), what the bot sent, and the waits tests use.

Separate from the gateway websocket (``discord_gateway``) and the REST routes
(``discord_rest``), which both build on ``DiscordState``; ``FakeDiscord`` in
``discord_server`` joins them and owns the server's lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

JSON = dict[str, Any]
TOKEN = "MTAwMDAw.fake-discord-token.never-log-me"
BOT_ID = 900000000000000001
APP_ID = 900000000000000002
TEXT_LIMIT = 2000
MAX_UPLOAD = 25 * 1024 * 1024
DISCORD_EPOCH_MS = 1_420_070_400_000
PRIVILEGED_INTENTS = (1 << 1) | (1 << 8) | (1 << 15)  # members, presences, message content
MESSAGE_CONTENT = 1 << 15

CHANNEL_TEXT, CHANNEL_DM, CHANNEL_PUBLIC_THREAD = 0, 1, 11
MESSAGE_DEFAULT, MESSAGE_REPLY = 0, 19


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(slots=True)
class Sent:
    """One message the bot created (or edited), as the fake recorded it."""

    channel_id: int
    message_id: int
    content: str
    reference: int | None = None
    """The message this one replies to."""
    allowed_mentions: JSON | None = None
    nonce: str | None = None
    files: list[tuple[str, bytes]] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Failure:
    """A scripted failure of one REST call (``fail_next``)."""

    status: int
    body: JSON
    retry_after: float | None = None
    drop: bool = False
    after_commit: bool = False


@dataclass(slots=True, eq=False)
class Connection:
    """One gateway websocket: frames go out through ``outbox``, zlib-compressed when asked."""

    ws: web.WebSocketResponse
    request: web.Request
    compressor: Any | None
    outbox: asyncio.Queue[JSON | None] = field(default_factory=asyncio.Queue)

    def put(self, payload: JSON | None) -> None:
        self.outbox.put_nowait(payload)

    def encode(self, payload: JSON) -> str | bytes:
        text = json.dumps(payload)
        if self.compressor is None:
            return text
        return self.compressor.compress(text.encode()) + self.compressor.flush(zlib.Z_SYNC_FLUSH)


class DiscordState:
    """Everything the fake knows; the gateway and REST halves read and change it."""

    def __init__(self, *, token: str = TOKEN, bot_id: int = BOT_ID, bot_name: str = "Parley",
                 heartbeat_interval: float = 1.0, host: str = "127.0.0.1") -> None:
        """``heartbeat_interval`` in seconds, as HELLO announces it (Discord's is ~41 s)."""
        self.token = token
        self.bot: JSON = {"id": str(bot_id), "username": bot_name.lower(), "global_name":
                          bot_name, "discriminator": "0", "avatar": None, "bot": True,
                          "flags": 0, "verified": True, "mfa_enabled": False}
        self.heartbeat_interval = heartbeat_interval
        self._host = host
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._failures: dict[str, deque[Failure | None]] = {}
        self._conn: Connection | None = None
        self._connections: list[Connection] = []
        self._session_id: str | None = None
        self._seq = 0
        self._events: list[tuple[int, JSON]] = []
        self.users: dict[int, JSON] = {bot_id: self.bot}
        self.guilds: dict[int, JSON] = {}
        self.channels: dict[int, JSON] = {}
        self.messages: dict[int, JSON] = {}
        self.files: dict[int, tuple[str, bytes]] = {}
        self.sent: list[Sent] = []
        self.deleted: list[Sent] = []
        self.reactions: dict[int, list[str]] = {}
        """The bot's reactions now, per message."""
        self.reaction_log: list[tuple[str, int, str]] = []
        """("add" | "remove", message id, emoji), in order."""
        self.typing: list[int] = []
        """Channel ids the bot sent "typing…" to, in order."""
        self.calls: list[tuple[str, str]] = []
        """Every REST call: (method, path below the API base)."""
        self.privileged_intents = True
        """False: the application may not use message content (IDENTIFY closes with 4014)."""
        self.ack_heartbeats = True
        self.identifies: list[JSON] = []
        self.sessions: set[Connection] = set()
        """Connections identified or resumed and still open: each a session Discord would
        dispatch to (a second IDENTIFY does not end the first connection's session)."""
        self.most_sessions = 0
        """The most ``sessions`` open at one time."""
        self.resumes: list[JSON] = []
        self.heartbeats = 0
        self.gateway_urls: list[str] = []
        """The path and query of every gateway connection (encoding, version, compression)."""
        self.replayed = 0
        """Events sent again after a RESUME (missed while the client was away)."""
        self.gateway_open = True
        """False: new gateway connections are refused with 503, as in an outage."""
        self._nonces: dict[tuple[int, str], int] = {}
        self._malformed: dict[str, deque[str]] = {}
        self.deaf = False
        """True: this connection stops dispatching (heartbeats are still acknowledged) until
        the client connects again; the events are kept for a RESUME, as Discord keeps a
        session's missed events."""

    @property
    def root(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def api_base(self) -> str:
        """What ``channels.discord.api_base`` is set to (discord.py's ``Route.BASE``)."""
        return f"{self.root}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://{self._host}:{self._port}/gateway"

    @property
    def connected(self) -> bool:
        """A client is identified or resumed on a live connection."""
        return self._conn is not None and not self._conn.ws.closed

    # -- building the world ---------------------------------------------------------------------

    def snowflake(self) -> int:
        """A fresh id whose timestamp is now, like Discord's (discord.py reads times from ids)."""
        ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
        return (ms << 22) | (next(self._ids) & 0x3FFFFF)

    def user(self, user_id: int, username: str, *, global_name: str | None = None,
             bot: bool = False) -> JSON:
        out: JSON = {"id": str(user_id), "username": username, "global_name": global_name,
                     "discriminator": "0", "avatar": None}
        if bot:
            out["bot"] = True
        self.users[user_id] = out
        return out

    def guild(self, guild_id: int, name: str, *, bot_roles: tuple[int, ...] = ()) -> JSON:
        """A guild the bot is in, with its @everyone role and the bot's managed role."""
        managed = {"id": str(guild_id + 1), "name": self.bot["global_name"], "position": 1,
                   "color": 0, "hoist": False, "managed": True, "mentionable": True,
                   "permissions": "0", "flags": 0, "tags": {"bot_id": self.bot["id"]}}
        everyone = {"id": str(guild_id), "name": "@everyone", "position": 0, "color": 0,
                    "hoist": False, "managed": False, "mentionable": False,
                    "permissions": "0", "flags": 0}
        guild: JSON = {
            "id": str(guild_id), "name": name, "unavailable": False, "owner_id": "1",
            "member_count": 2, "large": False, "features": [], "emojis": [], "stickers": [],
            "roles": [everyone, managed], "channels": [], "threads": [], "voice_states": [],
            "presences": [], "stage_instances": [], "guild_scheduled_events": [],
            "joined_at": now_iso(), "premium_tier": 0, "verification_level": 0,
            "members": [{"user": self.bot, "roles": [managed["id"], *map(str, bot_roles)],
                         "joined_at": now_iso(), "deaf": False, "mute": False, "flags": 0}]}
        self.guilds[guild_id] = guild
        return guild

    def role(self, guild: JSON, role_id: int, name: str) -> JSON:
        role = {"id": str(role_id), "name": name, "position": 2, "color": 0, "hoist": False,
                "managed": False, "mentionable": True, "permissions": "0", "flags": 0}
        guild["roles"].append(role)
        return role

    def text_channel(self, guild: JSON, channel_id: int, name: str) -> JSON:
        channel = {"id": str(channel_id), "type": CHANNEL_TEXT, "guild_id": guild["id"],
                   "name": name, "position": len(guild["channels"]),
                   "permission_overwrites": [], "nsfw": False, "parent_id": None,
                   "topic": None, "last_message_id": None, "rate_limit_per_user": 0}
        guild["channels"].append(channel)
        self.channels[channel_id] = channel
        return channel

    def thread(self, parent: JSON, thread_id: int, name: str, *, announce: bool = True) -> JSON:
        """A public thread in ``parent``; ``announce`` sends THREAD_CREATE to a live client."""
        thread = {"id": str(thread_id), "type": CHANNEL_PUBLIC_THREAD,
                  "guild_id": parent["guild_id"], "parent_id": parent["id"], "name": name,
                  "owner_id": "1", "message_count": 0, "member_count": 1,
                  "rate_limit_per_user": 0, "flags": 0, "last_message_id": None,
                  "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                      "archive_timestamp": now_iso(), "locked": False}}
        self.guilds[int(parent["guild_id"])]["threads"].append(thread)
        self.channels[thread_id] = thread
        if announce:
            self.dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        return thread

    def dm_channel(self, user: JSON) -> JSON:
        channel_id = int(user["id"]) + 5_000_000
        channel = {"id": str(channel_id), "type": CHANNEL_DM, "recipients": [user],
                   "last_message_id": None, "flags": 0}
        self.channels[channel_id] = channel
        return channel

    # -- what users do --------------------------------------------------------------------------

    def post(self, channel: JSON, author: JSON, content: str = "", *,
             mentions: tuple[JSON, ...] = (), mention_roles: tuple[JSON, ...] = (),
             reply_to: JSON | None = None, nick: str | None = None,
             attachments: tuple[tuple[str, bytes, str], ...] = (),
             sizes: tuple[int, ...] = ()) -> JSON:
        """A user's message: stored and sent to the bot as MESSAGE_CREATE. ``attachments`` are
        (filename, data, content type); ``sizes`` overrides their announced sizes."""
        channel_id = int(channel["id"])
        files = []
        for i, (name, data, mime) in enumerate(attachments):
            file_id = self.snowflake()
            self.files[file_id] = (name, data)
            url = f"{self.root}/attachments/{file_id}/{name}"
            files.append({"id": str(file_id), "filename": name, "content_type": mime,
                          "size": sizes[i] if i < len(sizes) else len(data), "url": url,
                          "proxy_url": url})
        msg = self._message(channel_id, author, content, attachments=files,
                            mentions=[{**u, "member": {"roles": [], "joined_at": now_iso(),
                                                       "deaf": False, "mute": False}}
                                      if "guild_id" in channel else u for u in mentions],
                            mention_roles=[r["id"] for r in mention_roles],
                            reply_to=reply_to, nick=nick)
        self.dispatch("MESSAGE_CREATE", msg)
        return msg

    def _message(self, channel_id: int, author: JSON, content: str, *,
                 attachments: list[JSON] | None = None, mentions: list[JSON] | None = None,
                 mention_roles: list[str] | None = None, reply_to: JSON | None = None,
                 nick: str | None = None, nonce: str | None = None) -> JSON:
        channel = self.channels[channel_id]
        msg: JSON = {
            "id": str(self.snowflake()), "channel_id": str(channel_id), "author": author,
            "content": content, "timestamp": now_iso(), "edited_timestamp": None,
            "tts": False, "mention_everyone": False, "mentions": mentions or [],
            "mention_roles": mention_roles or [], "attachments": attachments or [],
            "embeds": [], "pinned": False, "flags": 0, "components": [],
            "type": MESSAGE_REPLY if reply_to else MESSAGE_DEFAULT}
        if nonce is not None:
            msg["nonce"] = nonce
        if "guild_id" in channel:
            msg["guild_id"] = channel["guild_id"]
            msg["member"] = {"nick": nick, "roles": [], "joined_at": now_iso(),
                             "deaf": False, "mute": False, "flags": 0}
        if reply_to is not None:
            msg["message_reference"] = {"message_id": reply_to["id"],
                                        "channel_id": reply_to["channel_id"], "type": 0}
            if "guild_id" in channel:
                msg["message_reference"]["guild_id"] = channel["guild_id"]
            msg["referenced_message"] = reply_to
        self.messages[int(msg["id"])] = msg
        return msg

    def bot_message(self, sent: Sent) -> JSON:
        """A message of the bot's, to reply to."""
        return self.messages[sent.message_id]

    # -- the session's events -------------------------------------------------------------------

    def dispatch(self, event: str, data: JSON) -> None:
        """Send a DISPATCH to the session; while no client is connected, it waits for RESUME."""
        if self._session_id is None:
            return  # no session: Discord does not keep events for a bot that never connected
        self._seq += 1
        payload = {"op": 0, "t": event, "s": self._seq, "d": data}
        self._events.append((self._seq, payload))
        if self._conn is not None and not self.deaf:
            self._conn.put(payload)

    # -- inspecting -----------------------------------------------------------------------------

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def sent_to(self, channel_id: int | str) -> list[Sent]:
        return [s for s in self.sent if s.channel_id == int(channel_id)]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_sent(self, channel_id: int | str, n: int = 1,
                        timeout: float = 10.0) -> list[Sent]:
        """The first ``n`` messages sent to ``channel_id``, waiting for them to arrive."""
        try:
            await self.wait_for(lambda: len(self.sent_to(channel_id)) >= n, timeout)
        except TimeoutError:
            raise AssertionError(f"{len(self.sent_to(channel_id))} of {n} message(s) to "
                                 f"channel {channel_id} within {timeout}s: "
                                 f"{[s.content for s in self.sent_to(channel_id)]}") from None
        return self.sent_to(channel_id)[:n]
