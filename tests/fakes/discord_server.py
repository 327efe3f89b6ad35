"""A fake Discord (REST API v10 and gateway websocket) on loopback that discord.py really uses.

Why: mocking discord.py would test our mocks; this server speaks Discord's wire format instead,
so the real library runs end to end: login, the gateway handshake (HELLO, IDENTIFY, READY,
GUILD_CREATE), heartbeats, RESUME after a dropped connection, its REST client, its rate
limiter and its error mapping (``Forbidden``, ``NotFound``, ``HTTPException``).

    async with FakeDiscord() as dc:
        config = {"token": dc.token, "api_base": dc.api_base}
        ada = dc.user(1001, "ada", global_name="Ada")
        dm = dc.dm_channel(ada)
        dc.post(dm, ada, "hello")                     # MESSAGE_CREATE on the gateway
        [reply] = await dc.wait_sent(dm["id"])         # what the bot sent to that channel

Gateway: ``GET /gateway`` names ``ws://.../gateway``; the socket sends HELLO, acknowledges
heartbeats (unless ``ack_heartbeats`` is False), answers IDENTIFY with READY and a
GUILD_CREATE per guild (closing with 4004 for a wrong token and 4014 for a privileged intent
the application may not use, per ``privileged_intents``), and RESUME with the events missed
since the client's sequence, then RESUMED (an unknown session gets INVALID_SESSION).
``compress=zlib-stream`` in the connect URL gets one zlib stream with a sync flush per
message, as Discord sends it; otherwise JSON text frames. ``drop_gateway()`` cuts the
connection; events dispatched meanwhile wait for the client's RESUME.

REST: the bot user and application, channels, message create/edit with Discord's validation
(empty → 50006, over 2000 characters → 50035, files over 25 MiB → 40005; ``nonce`` with
``enforce_nonce`` returns the message already created), message history, typing, and
attachment downloads. Every answer is ``Content-Type: application/json`` exactly, as discord.py
expects; ``fail_next()`` answers 429 with ``retry_after`` (and the ``Via`` header that tells
discord.py it is Discord's limit, not a Cloudflare ban), a 5xx, or drops the connection,
before or after the message was created.
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
from types import TracebackType
from typing import Any, Self

from aiohttp import WSMsgType, web

__all__ = ["BOT_ID", "FakeDiscord", "Sent", "TOKEN"]

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


def _now_iso() -> str:
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
class _Failure:
    status: int
    body: JSON
    retry_after: float | None = None
    drop: bool = False
    after_commit: bool = False


class ApiError(Exception):
    def __init__(self, status: int, code: int, message: str, errors: JSON | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: JSON = {"message": message, "code": code}
        if errors is not None:
            self.body["errors"] = errors


@dataclass(slots=True)
class _Connection:
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


class FakeDiscord:
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
        self._failures: dict[str, deque[_Failure | None]] = {}
        self._conn: _Connection | None = None
        self._connections: list[_Connection] = []
        self._session_id: str | None = None
        self._seq = 0
        self._events: list[tuple[int, JSON]] = []
        self.users: dict[int, JSON] = {bot_id: self.bot}
        self.guilds: dict[int, JSON] = {}
        self.channels: dict[int, JSON] = {}
        self.messages: dict[int, JSON] = {}
        self.files: dict[int, tuple[str, bytes]] = {}
        self.sent: list[Sent] = []
        self.typing: list[int] = []
        """Channel ids the bot sent "typing…" to, in order."""
        self.calls: list[tuple[str, str]] = []
        """Every REST call: (method, path below the API base)."""
        self.privileged_intents = True
        """False: the application may not use message content (IDENTIFY closes with 4014)."""
        self.ack_heartbeats = True
        self.identifies: list[JSON] = []
        self.resumes: list[JSON] = []
        self.heartbeats = 0
        self.gateway_urls: list[str] = []
        """The path and query of every gateway connection (encoding, version, compression)."""
        self.replayed = 0
        """Events sent again after a RESUME (missed while the client was away)."""
        self.gateway_open = True
        """False: new gateway connections are refused with 503, as in an outage."""
        self._nonces: dict[tuple[int, str], int] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_route("*", "/api/v10/{path:.*}", self._api)
        app.router.add_get("/attachments/{id}/{name}", self._download)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, 0).start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        for conn in self._connections:
            conn.put(None)
            if not conn.ws.closed:
                await conn.ws.close(code=1001)
        self._conn = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

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
            "joined_at": _now_iso(), "premium_tier": 0, "verification_level": 0,
            "members": [{"user": self.bot, "roles": [managed["id"], *map(str, bot_roles)],
                         "joined_at": _now_iso(), "deaf": False, "mute": False, "flags": 0}]}
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
                                      "archive_timestamp": _now_iso(), "locked": False}}
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
                            mentions=[{**u, "member": {"roles": [], "joined_at": _now_iso(),
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
            "content": content, "timestamp": _now_iso(), "edited_timestamp": None,
            "tts": False, "mention_everyone": False, "mentions": mentions or [],
            "mention_roles": mention_roles or [], "attachments": attachments or [],
            "embeds": [], "pinned": False, "flags": 0, "components": [],
            "type": MESSAGE_REPLY if reply_to else MESSAGE_DEFAULT}
        if nonce is not None:
            msg["nonce"] = nonce
        if "guild_id" in channel:
            msg["guild_id"] = channel["guild_id"]
            msg["member"] = {"nick": nick, "roles": [], "joined_at": _now_iso(),
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

    # -- the gateway ----------------------------------------------------------------------------

    def dispatch(self, event: str, data: JSON) -> None:
        """Send a DISPATCH to the session; while no client is connected, it waits for RESUME."""
        if self._session_id is None:
            return  # no session: Discord does not keep events for a bot that never connected
        self._seq += 1
        payload = {"op": 0, "t": event, "s": self._seq, "d": data}
        self._events.append((self._seq, payload))
        if self._conn is not None:
            self._conn.put(payload)

    async def drop_gateway(self, code: int | None = None) -> None:
        """Cut the live connection: no close frame (a network failure), or close with ``code``
        (4000 unknown error, 4014 disallowed intents, ...). The session survives for RESUME."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.put(None)
        if code is None:
            transport = conn.request.transport
            if transport is not None:
                transport.abort()
        else:
            await conn.ws.close(code=code)
        await self._notify()

    async def invalidate_session(self) -> None:
        """Forget the session and cut the connection: the client's RESUME is refused
        (INVALID_SESSION) and it must IDENTIFY again; what happened meanwhile is not replayed."""
        self._session_id = None
        self._events.clear()
        await self.drop_gateway()

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if not self.gateway_open:
            self.gateway_urls.append(str(request.rel_url))
            return web.Response(status=503, text="Service Unavailable")
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self.gateway_urls.append(str(request.rel_url))
        compress = request.query.get("compress")
        conn = _Connection(ws, request, zlib.compressobj() if compress == "zlib-stream"
                           else None)
        self._connections.append(conn)
        writer = asyncio.create_task(self._write(conn), name="fake-discord-writer")
        self._tasks.add(writer)
        writer.add_done_callback(self._tasks.discard)
        conn.put({"op": 10, "d": {"heartbeat_interval": int(self.heartbeat_interval * 1000)},
                  "s": None, "t": None})
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                await self._on_frame(conn, json.loads(frame.data))
        finally:
            if self._conn is conn:
                self._conn = None
            conn.put(None)
            await self._notify()
        return ws

    async def _write(self, conn: _Connection) -> None:
        while True:
            payload = await conn.outbox.get()
            if payload is None or conn.ws.closed:
                return
            data = conn.encode(payload)
            try:
                if isinstance(data, bytes):
                    await conn.ws.send_bytes(data)
                else:
                    await conn.ws.send_str(data)
            except (ConnectionError, RuntimeError):
                return

    async def _on_frame(self, conn: _Connection, frame: JSON) -> None:
        op, data = frame.get("op"), frame.get("d")
        if op == 1:
            self.heartbeats += 1
            if self.ack_heartbeats:
                conn.put({"op": 11, "d": None, "s": None, "t": None})
        elif op == 2:
            await self._identify(conn, data or {})
        elif op == 6:
            await self._resume(conn, data or {})
        await self._notify()

    async def _identify(self, conn: _Connection, data: JSON) -> None:
        self.identifies.append(data)
        if data.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        intents = int(data.get("intents") or 0)
        if intents & PRIVILEGED_INTENTS and not self.privileged_intents:
            await conn.ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        self._session_id = f"session-{next(self._ids)}"
        self._seq = 0
        self._events.clear()
        self._conn = conn
        self.dispatch("READY", {
            "v": 10, "user": self.bot, "session_id": self._session_id,
            "resume_gateway_url": self.gateway_url, "private_channels": [],
            "guilds": [{"id": g["id"], "unavailable": True} for g in self.guilds.values()],
            "application": {"id": str(APP_ID), "flags": 0}})
        for guild in self.guilds.values():
            self.dispatch("GUILD_CREATE", guild)

    async def _resume(self, conn: _Connection, data: JSON) -> None:
        self.resumes.append(data)
        if data.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        if data.get("session_id") != self._session_id or self._session_id is None:
            conn.put({"op": 9, "d": False, "s": None, "t": None})
            return
        after = int(data.get("seq") or 0)
        self._conn = conn
        for seq, payload in self._events:
            if seq > after:
                self.replayed += 1
                conn.put(payload)
        self.dispatch("RESUMED", {})

    # -- inspecting and failing -----------------------------------------------------------------

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

    def fail_next(self, route: str = "create_message", status: int = 429, *,
                  retry_after: float = 0.2, is_global: bool = False, times: int = 1,
                  skip: int = 0, drop: bool = False, after_commit: bool = False) -> None:
        """After ``skip`` more calls that succeed, the next ``times`` calls of ``route``
        (``create_message``, ``typing``, ``login``, ...) fail: 429 with ``retry_after``
        seconds, any other status with Discord's body, or ``drop=True``: the connection closes
        without an answer, before the message was created or, with ``after_commit``, after."""
        body: JSON = {"message": "You are being rate limited.", "retry_after": retry_after,
                      "global": is_global} if status == 429 else {
            "message": {500: "500: Internal Server Error", 502: "502: Bad Gateway",
                        503: "503: Service Unavailable"}.get(status, f"{status}: Error"),
            "code": 0}
        queue = self._failures.setdefault(route, deque())
        queue.extend([None] * skip)
        for _ in range(times):
            queue.append(_Failure(status, body, retry_after if status == 429 else None,
                                  drop, after_commit))

    # -- REST -----------------------------------------------------------------------------------

    _ROUTES: tuple[tuple[str, str, str], ...] = (
        ("GET", "users/@me", "login"),
        ("GET", "oauth2/applications/@me", "application"),
        ("GET", "gateway", "gateway"),
        ("GET", "gateway/bot", "gateway_bot"),
        ("GET", "channels/{}", "get_channel"),
        ("GET", "channels/{}/messages", "history"),
        ("GET", "channels/{}/messages/{}", "get_message"),
        ("POST", "channels/{}/messages", "create_message"),
        ("PATCH", "channels/{}/messages/{}", "edit_message"),
        ("POST", "channels/{}/typing", "typing"),
    )

    @classmethod
    def _route(cls, method: str, path: str) -> tuple[str, list[int]] | None:
        parts = path.strip("/").split("/")
        for want_method, pattern, name in cls._ROUTES:
            want = pattern.split("/")
            if want_method != method or len(want) != len(parts):
                continue
            ids: list[int] = []
            for w, p in zip(want, parts, strict=True):
                if w == "{}" and p.isdigit():
                    ids.append(int(p))
                elif w != p:
                    break
            else:
                return name, ids
        return None

    async def _api(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        self.calls.append((request.method, path))
        try:
            if request.headers.get("Authorization") != f"Bot {self.token}":
                raise ApiError(401, 0, "401: Unauthorized")
            found = self._route(request.method, path)
            if found is None:
                raise ApiError(404, 0, "404: Not Found")
            name, ids = found
            failure = self._next_failure(name)
            if failure is not None and not failure.after_commit:
                return self._fail(request, failure)
            result = await getattr(self, f"_r_{name}")(request, *ids)
            if failure is not None:
                return self._fail(request, failure)
            if result is None:
                return web.Response(status=204)
            return _json(200, result)
        except ApiError as exc:
            return _json(exc.status, exc.body)
        finally:
            await self._notify()

    def _next_failure(self, route: str) -> _Failure | None:
        queue = self._failures.get(route)
        return queue.popleft() if queue else None

    @staticmethod
    def _fail(request: web.Request, failure: _Failure) -> web.StreamResponse:
        if failure.drop:
            if request.transport is not None:
                request.transport.abort()
            return web.Response()
        headers = {"Via": "1.1 google"}
        if failure.retry_after is not None:
            headers.update({"Retry-After": str(max(1, round(failure.retry_after))),
                            "X-RateLimit-Scope": "user"})
        return _json(failure.status, failure.body, headers)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        found = self.files.get(int(request.match_info["id"]))
        if found is None or found[0] != request.match_info["name"]:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=found[1], content_type="application/octet-stream")

    # -- routes ---------------------------------------------------------------------------------

    async def _r_login(self, request: web.Request) -> JSON:
        return self.bot

    async def _r_application(self, request: web.Request) -> JSON:
        return {"id": str(APP_ID), "name": self.bot["global_name"], "icon": None,
                "description": "", "bot_public": True, "bot_require_code_grant": False,
                "verify_key": "0" * 64, "flags": 0, "owner": self.users.get(1) or {
                    "id": "1", "username": "owner", "global_name": None,
                    "discriminator": "0", "avatar": None},
                "bot": self.bot}

    async def _r_gateway(self, request: web.Request) -> JSON:
        return {"url": self.gateway_url}

    async def _r_gateway_bot(self, request: web.Request) -> JSON:
        return {"url": self.gateway_url, "shards": 1, "session_start_limit": {
            "total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}}

    def _channel(self, channel_id: int) -> JSON:
        channel = self.channels.get(channel_id)
        if channel is None:
            raise ApiError(404, 10003, "Unknown Channel")
        return channel

    async def _r_get_channel(self, request: web.Request, channel_id: int) -> JSON:
        return self._channel(channel_id)

    async def _r_get_message(self, request: web.Request, channel_id: int,
                             message_id: int) -> JSON:
        self._channel(channel_id)
        msg = self.messages.get(message_id)
        if msg is None or int(msg["channel_id"]) != channel_id:
            raise ApiError(404, 10008, "Unknown Message")
        return msg

    async def _r_history(self, request: web.Request, channel_id: int) -> list[JSON]:
        """Newest first, as Discord answers ``before``/no anchor; ``after`` also newest first
        (discord.py reverses it)."""
        self._channel(channel_id)
        limit = min(int(request.query.get("limit", "50")), 100)
        after = int(request.query.get("after", "0"))
        before = int(request.query.get("before", str(1 << 63)))
        found = sorted((m for m in self.messages.values()
                        if int(m["channel_id"]) == channel_id and after < int(m["id"]) < before),
                       key=lambda m: int(m["id"]))
        found = found[:limit] if "after" in request.query else found[-limit:]
        return list(reversed(found))

    async def _r_typing(self, request: web.Request, channel_id: int) -> None:
        self._channel(channel_id)
        self.typing.append(channel_id)

    async def _payload(self, request: web.Request) -> tuple[JSON, list[tuple[str, bytes]]]:
        if request.content_type == "multipart/form-data":
            form = await request.post()
            payload = json.loads(str(form.get("payload_json") or "{}"))
            files = [(v.filename, v.file.read()) for k, v in form.items()
                     if k.startswith("files[") and isinstance(v, web.FileField)]
            return payload, files
        if request.content_type != "application/json":
            raise ApiError(400, 50109, "The request body contains invalid JSON.")
        return await request.json(), []

    @staticmethod
    def _check_content(content: str, has_other: bool) -> None:
        if len(content) > TEXT_LIMIT:
            raise ApiError(400, 50035, "Invalid Form Body", {"content": {"_errors": [{
                "code": "BASE_TYPE_MAX_LENGTH",
                "message": f"Must be {TEXT_LIMIT} or fewer in length."}]}})
        if not content.strip() and not has_other:
            raise ApiError(400, 50006, "Cannot send an empty message")

    async def _r_create_message(self, request: web.Request, channel_id: int) -> JSON:
        self._channel(channel_id)
        payload, files = await self._payload(request)
        nonce = payload.get("nonce")
        if nonce is not None and payload.get("enforce_nonce"):
            known = self._nonces.get((channel_id, str(nonce)))
            if known is not None:
                return self.messages[known]
        content = payload.get("content") or ""
        self._check_content(content, bool(files or payload.get("embeds")))
        if any(len(data) > MAX_UPLOAD for _, data in files):
            raise ApiError(413, 40005, "Request entity too large")
        reference = payload.get("message_reference")
        replied: JSON | None = None
        if reference:
            replied = self.messages.get(int(reference["message_id"]))
            if replied is None and reference.get("fail_if_not_exists", True):
                raise ApiError(400, 50035, "Invalid Form Body", {"message_reference": {
                    "_errors": [{"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                                 "message": "Unknown message"}]}})
        attachments = []
        for name, data in files:
            file_id = self.snowflake()
            self.files[file_id] = (name, data)
            url = f"{self.root}/attachments/{file_id}/{name}"
            attachments.append({"id": str(file_id), "filename": name, "size": len(data),
                                "url": url, "proxy_url": url})
        msg = self._message(channel_id, self.bot, content, attachments=attachments,
                            reply_to=replied, nonce=str(nonce) if nonce is not None else None)
        if nonce is not None and payload.get("enforce_nonce"):
            self._nonces[(channel_id, str(nonce))] = int(msg["id"])
        self.sent.append(Sent(channel_id, int(msg["id"]), content,
                              int(replied["id"]) if replied else None,
                              payload.get("allowed_mentions"),
                              str(nonce) if nonce is not None else None, files))
        self.dispatch("MESSAGE_CREATE", msg)
        return msg

    async def _r_edit_message(self, request: web.Request, channel_id: int,
                              message_id: int) -> JSON:
        self._channel(channel_id)
        msg = self.messages.get(message_id)
        if msg is None or int(msg["channel_id"]) != channel_id:
            raise ApiError(404, 10008, "Unknown Message")
        if msg["author"]["id"] != self.bot["id"]:
            raise ApiError(403, 50005, "Cannot edit a message authored by another user")
        payload, _ = await self._payload(request)
        content = payload.get("content", msg["content"]) or ""
        self._check_content(content, bool(msg["attachments"]))
        sent = next(s for s in self.sent if s.message_id == message_id)
        sent.edits.append(sent.content)
        sent.content = msg["content"] = content
        msg["edited_timestamp"] = _now_iso()
        self.dispatch("MESSAGE_UPDATE", msg)
        return msg


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    """Discord's JSON answer: discord.py parses a body only when the content type is exactly
    ``application/json`` (aiohttp's ``json_response`` would add ``; charset=utf-8``)."""
    return web.Response(status=status, body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json", **(headers or {})})
