"""A fake Slack (Web API and Socket Mode) on loopback that slack-sdk really uses.

Why: mocking slack-sdk would test our mocks; this server speaks Slack's wire format, so the
real ``AsyncWebClient`` (``base_url`` pointed here) and the real aiohttp ``SocketModeClient``
run end to end: ``apps.connections.open`` hands out this server's WebSocket URL, the socket
says ``hello``, events arrive as ``events_api`` envelopes the client must acknowledge, a
``disconnect`` makes the client fetch a new URL and reconnect.

    async with FakeSlack() as slack:
        config = {"bot_token": slack.bot_token, "app_token": slack.app_token,
                  "api_base": slack.api_base}
        await slack.say("U1", "D1", "hello")            # a DM, delivered as an envelope
        [reply] = await slack.wait_posts("D1")         # what the bot posted there

Web API: ``auth.test``, ``apps.connections.open``, ``chat.postMessage`` (the bot's own messages
are echoed back as events, as Slack does), ``chat.update`` and ``chat.delete`` (of the bot's
own posts; ``message_not_found`` otherwise), ``reactions.add``/``remove``, the three-step file
upload (``files.getUploadURLExternal``, the upload URL, ``files.completeUploadExternal``) and
file downloads that need the bot token. ``fail_next(method, ...)`` answers one call with an
error, or HTTP 429 with ``Retry-After``; ``refuse_posts`` refuses every post. No wait here is on
the wall clock: tests wait for events (a post, an acknowledgement, a connection).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import WSMsgType, web

BOT_USER = "UBOT"
BOT_ID = "BBOT"
TEAM = "T0001"


@dataclass
class Post:
    channel: str
    ts: str
    text: str
    thread_ts: str | None = None
    user: str = BOT_USER
    files: list[dict[str, Any]] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    """The texts ``chat.update`` replaced, oldest first (``text`` is the latest)."""


class FakeSlack:
    def __init__(self) -> None:
        self.bot_token = "xoxb-fake-bot-token"
        self.app_token = "xapp-fake-app-token"
        self.posts: dict[str, list[Post]] = defaultdict(list)
        self.reactions: list[tuple[str, str, str, str]] = []
        self.deleted: list[Post] = []
        """(method, channel, ts, name) in order."""
        self.uploads: dict[str, bytes] = {}
        self.downloads: dict[str, bytes] = {}
        self.download_auth: list[str | None] = []
        self.calls: list[str] = []
        self.connections = 0
        self.acked: set[str] = set()
        self.refuse_posts = False
        self.echo = True
        """Send the bot its own messages back (False: a deaf socket)."""
        self._failures: dict[str, list[tuple[int, str, float | None]]] = defaultdict(list)
        self._pending: list[dict[str, Any]] = []
        self._socket: web.WebSocketResponse | None = None
        self._sending = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._ts = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.base = ""

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link", self._link)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files/{file_id}/{name}", self._download)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def api_base(self) -> str:
        return f"{self.base}/api/"

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Until ``predicate()`` holds (a safety cap, never the outcome)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    # --- what a test does -----------------------------------------------------------------------

    def next_ts(self) -> str:
        return f"1700000000.{next(self._ts):06d}"

    async def event(self, event: dict[str, Any]) -> str:
        """Deliver one Events API event (now, or at the next connection); its envelope id."""
        envelope_id = uuid.uuid4().hex
        envelope = {"envelope_id": envelope_id, "type": "events_api",
                    "accepts_response_payload": False, "retry_attempt": 0,
                    "retry_reason": "",
                    "payload": {"type": "event_callback", "team_id": TEAM,
                                "api_app_id": "A0001", "event_id": f"Ev{envelope_id[:8]}",
                                "event_time": 1700000000, "event": event}}
        self._pending.append(envelope)
        await self._flush()
        return envelope_id

    async def say(self, user: str, channel: str, text: str, *, thread_ts: str | None = None,
                  channel_type: str = "im", files: list[dict[str, Any]] | None = None,
                  ts: str | None = None, wait: bool = True, profile: bool = True) -> str:
        """A user's message; returns its ts once the client acknowledged it (``wait``).
        ``profile``: the event carries the sender's names (else only the id, as in many
        events: ``users.info`` knows them)."""
        ts = ts or self.next_ts()
        event: dict[str, Any] = {"type": "message", "channel": channel, "user": user,
                                 "text": text, "ts": ts, "channel_type": channel_type,
                                 "team": TEAM}
        if profile:
            event["user_profile"] = {"display_name": f"name-{user}",
                                     "real_name": f"Real {user}"}
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files:
            event["files"], event["subtype"] = files, "file_share"
        envelope = await self.event(event)
        if wait:
            await self.wait_for(lambda: envelope in self.acked)
        return ts

    def file(self, name: str, data: bytes, mimetype: str = "text/plain") -> dict[str, Any]:
        """A file a user shared: downloadable with the bot token only."""
        file_id = f"F{len(self.downloads) + 1:04d}"
        self.downloads[file_id] = data
        return {"id": file_id, "name": name, "mimetype": mimetype, "size": len(data),
                "url_private_download": f"{self.base}/files/{file_id}/{name}"}

    def fail_next(self, method: str, error: str = "internal_error", *, status: int = 200,
                  retry_after: float | None = None) -> None:
        """The next call of ``method`` fails: Slack's ``ok: false`` with ``error``, or HTTP
        ``status`` (429 with ``Retry-After`` when ``retry_after``)."""
        self._failures[method].append((status, error, retry_after))

    async def wait_posts(self, channel: str, count: int = 1) -> list[Post]:
        await self.wait_for(lambda: len(self.posts[channel]) >= count)
        return list(self.posts[channel])

    async def disconnect(self, reason: str = "refresh_requested") -> None:
        """What Slack does every few hours: a ``disconnect`` message, then the client reconnects
        with a new URL."""
        if self._socket is not None:
            await self._socket.send_str(json.dumps({"type": "disconnect", "reason": reason}))

    async def drop(self) -> None:
        """Cut the connection without a word."""
        if self._socket is not None:
            await self._socket.close()

    # --- Socket Mode ----------------------------------------------------------------------------

    async def _flush(self) -> None:
        async with self._sending:
            socket = self._socket
            while socket is not None and not socket.closed and self._pending:
                await socket.send_str(json.dumps(self._pending[0]))
                self._pending.pop(0)

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        old, self._socket = self._socket, ws
        if old is not None and not old.closed:
            await old.close()
        self.connections += 1
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1,
                                      "connection_info": {"app_id": "A0001"},
                                      "debug_info": {"host": "fake-slack"}}))
        await self._notify()
        await self._flush()
        async for frame in ws:
            if frame.type == WSMsgType.TEXT:
                data = json.loads(frame.data)
                if "envelope_id" in data:
                    self.acked.add(data["envelope_id"])
                    await self._notify()
        if self._socket is ws:
            self._socket = None
        await self._notify()
        return ws

    # --- Web API --------------------------------------------------------------------------------

    async def _args(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            args.update(await request.json())
        elif request.method == "POST":
            args.update(await request.post())
        return args

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.calls.append(method)
        auth = request.headers.get("Authorization", "")
        token = self.app_token if method == "apps.connections.open" else self.bot_token
        if auth != f"Bearer {token}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if self._failures[method]:
            status, error, retry_after = self._failures[method].pop(0)
            headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
            return web.json_response({"ok": False, "error": error}, status=status,
                                     headers=headers)
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        result = await handler(await self._args(request))
        await self._notify()
        return web.json_response({"ok": True, **result} if "error" not in result
                                 else {"ok": False, **result})

    async def _m_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"url": "https://fake.slack.com/", "team": "Fake", "user": "parley",
                "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID}

    async def _m_apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"url": f"{self.base.replace('http', 'ws', 1)}/link?ticket={uuid.uuid4().hex}"}

    async def _post(self, channel: str, text: str, thread_ts: str | None,
                    files: list[dict[str, Any]] | None = None) -> Post:
        post = Post(channel=channel, ts=self.next_ts(), text=text, thread_ts=thread_ts,
                    files=files or [])
        self.posts[channel].append(post)
        echo = {"type": "message", "channel": channel, "user": BOT_USER, "bot_id": BOT_ID,
                "text": text, "ts": post.ts, "channel_type": "im" if channel[0] == "D"
                else "channel"}
        if thread_ts:
            echo["thread_ts"] = thread_ts
        if self.echo:
            await self.event(echo)  # Slack sends the bot its own messages too
        return post

    async def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.refuse_posts:
            return {"error": "not_in_channel"}
        channel, text = str(args.get("channel") or ""), str(args.get("text") or "")
        if not channel:
            return {"error": "channel_not_found"}
        if not text:
            return {"error": "no_text"}
        if len(text) > 40000:
            return {"error": "msg_too_long"}
        post = await self._post(channel, text, args.get("thread_ts"))
        return {"channel": channel, "ts": post.ts,
                "message": {"type": "message", "text": text, "user": BOT_USER, "ts": post.ts}}

    def _find(self, args: dict[str, Any]) -> Post | None:
        ts = str(args.get("ts") or "")
        return next((p for p in self.posts[str(args.get("channel") or "")] if p.ts == ts), None)

    async def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        post, text = self._find(args), str(args.get("text") or "")
        if post is None:
            return {"error": "message_not_found"}
        if not text:
            return {"error": "no_text"}
        if len(text) > 40000:
            return {"error": "msg_too_long"}
        post.edits.append(post.text)
        post.text = text
        if self.echo:  # Slack tells the app about the edit, as a hidden message_changed
            await self.event({"type": "message", "subtype": "message_changed", "hidden": True,
                              "channel": post.channel, "ts": self.next_ts(),
                              "message": {"type": "message", "user": BOT_USER,
                                          "bot_id": BOT_ID, "text": text, "ts": post.ts}})
        return {"channel": post.channel, "ts": post.ts, "text": text}

    async def _m_chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        post = self._find(args)
        if post is None:
            return {"error": "message_not_found"}
        self.posts[post.channel].remove(post)
        self.deleted.append(post)
        return {"channel": post.channel, "ts": post.ts}

    async def _m_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = str(args.get("user") or "")
        if not user.startswith("U"):
            return {"error": "user_not_found"}
        return {"user": {"id": user, "name": user.lower(), "real_name": f"Real {user}",
                         "profile": {"display_name": f"name-{user}",
                                     "real_name": f"Real {user}"}}}

    async def _m_reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        self.reactions.append(("add", args["channel"], args["timestamp"], args["name"]))
        return {}

    async def _m_reactions_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        self.reactions.append(("remove", args["channel"], args["timestamp"], args["name"]))
        return {}

    async def _m_files_getUploadURLExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        file_id = f"FU{len(self.uploads) + 1:04d}"
        self.uploads[file_id] = b""
        return {"upload_url": f"{self.base}/upload/{file_id}", "file_id": file_id,
                "filename": args.get("filename")}

    async def _upload(self, request: web.Request) -> web.Response:
        self.uploads[request.match_info["file_id"]] = await request.read()
        return web.Response(text="OK - uploaded")

    async def _m_files_completeUploadExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.refuse_posts:
            return {"error": "not_in_channel"}
        files = json.loads(args["files"]) if isinstance(args["files"], str) else args["files"]
        shared = [{"id": f["id"], "title": f.get("title"), "size": len(self.uploads[f["id"]])}
                  for f in files]
        channel = args.get("channel_id")
        if channel:
            await self._post(channel, str(args.get("initial_comment") or ""),
                             args.get("thread_ts"), shared)
        return {"files": shared}

    async def _download(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        self.download_auth.append(auth)
        if auth != f"Bearer {self.bot_token}":  # Slack answers its login page
            return web.Response(text="<html>sign in</html>", content_type="text/html")
        data = self.downloads.get(request.match_info["file_id"])
        if data is None:
            raise web.HTTPNotFound()
        return web.Response(body=data, content_type="application/octet-stream")
