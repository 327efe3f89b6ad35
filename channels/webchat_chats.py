"""WebChat's past conversations: which chats one browser started, so the page can list them
and reopen any of them ("New conversation" starts another chat and keeps the old one).

A browser keeps a random ``profile`` id beside its chat ids in local storage and registers each
chat it opens (``POST /api/conversations``); ``GET /api/conversations?profile=`` lists that
profile's chats that hold messages, newest activity first, each titled by its first message.
A chat id belongs to the first profile that registered it. Only the chat → profile link is kept
here; titles, counts and times come from the log (``webchat_store``), so nothing is written
twice. Separate from ``webchat.py`` so the list reads (and merges) on its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from channels.http_api import ApiError, check_unicode, read_body
from channels.webchat_frames import check_chat_id
from gateway.kernel.store import Store
from gateway.kernel.store_sql import Migration, TableSet, register

MAX_LISTED = 50
TITLE_CHARS = 80

SCHEMA = """
CREATE TABLE IF NOT EXISTS webchat_conversations (
    chat_id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS webchat_conversations_profile ON webchat_conversations(profile);
"""
TABLES = register(TableSet("webchat_chats", (Migration(1, SCHEMA, SCHEMA),),
                           ("webchat_conversations",)))
"""The same DDL serves PostgreSQL (text columns only)."""

_LIST = f"""
SELECT chat_id, created_at,
  (SELECT substr(text, 1, {TITLE_CHARS}) FROM webchat_log l
    WHERE l.chat_id = c.chat_id AND l.role = 'user' ORDER BY seq LIMIT 1) AS title,
  (SELECT seq FROM webchat_log l WHERE l.chat_id = c.chat_id ORDER BY seq DESC LIMIT 1) AS last,
  (SELECT created_at FROM webchat_log l WHERE l.chat_id = c.chat_id
    ORDER BY seq DESC LIMIT 1) AS updated_at
FROM webchat_conversations c
WHERE profile = ? AND last IS NOT NULL
ORDER BY last DESC LIMIT ?
"""


class Conversations:
    """The table and the two routes; ``authorized(request)`` is the channel's token check."""

    def __init__(self, store: Store, authorized: Callable[[web.Request], bool], *,
                 body_timeout: float) -> None:
        self._store = store
        self._authorized = authorized
        self._body_timeout = body_timeout

    async def ensure_schema(self) -> None:
        await self._store.migrate(TABLES)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/conversations", self._get)
        app.router.add_post("/api/conversations", self._post)

    async def register(self, profile: str, chat_id: str) -> None:
        now = datetime.now(UTC).isoformat()
        async with self._store.transaction() as db:
            await db.execute("INSERT OR IGNORE INTO webchat_conversations (chat_id, profile, "
                             "created_at) VALUES (?, ?, ?)", (chat_id, profile, now))

    async def listed(self, profile: str) -> list[dict[str, Any]]:
        rows = await self._store.fetchall(_LIST, (profile, MAX_LISTED))
        return [{"chat_id": r[0], "title": r[2] or "", "updated_at": r[4] or r[1]}
                for r in rows]

    def _check(self, request: web.Request) -> None:
        if not self._authorized(request):
            raise ApiError("authorization: missing or wrong token", 401)

    async def _get(self, request: web.Request) -> web.Response:
        self._check(request)
        profile = check_chat_id(request.query.get("profile"), "profile")
        return web.json_response({"conversations": await self.listed(profile)})

    async def _post(self, request: web.Request) -> web.Response:
        self._check(request)
        if request.content_type != "application/json":  # no form posts from other sites
            raise ApiError("content-type: must be application/json", 415)
        raw = await read_body(request, self._body_timeout, "channels.webchat.body_timeout")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise ApiError("body: not valid JSON") from None
        if not isinstance(data, dict):
            raise ApiError("body: must be a JSON object")
        check_unicode(data)
        unknown = sorted(set(data) - {"profile", "chat_id"})
        if unknown:
            raise ApiError(f"{unknown[0]}: unknown field")
        profile = check_chat_id(data.get("profile"), "profile")  # FrameError: a 400
        await self.register(profile, check_chat_id(data.get("chat_id")))
        return web.json_response({"ok": True})
