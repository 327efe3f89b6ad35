"""The fake Discord's REST API v10: routing and the bot token check, scripted failures
(``fail_next``: 429 with Discord's headers, 5xx, a dropped connection, before or after the
message was created), the routes discord.py calls, with Discord's validation and error codes,
and attachment downloads.

Separate from the gateway websocket (``discord_gateway``): the two halves share only
``DiscordState``.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from tests.fakes.discord_state import (
    APP_ID,
    JSON,
    MAX_UPLOAD,
    TEXT_LIMIT,
    DiscordState,
    Failure,
    Sent,
    now_iso,
)


class ApiError(Exception):
    """A REST answer in Discord's error format: ``{"message", "code", "errors"}``."""

    def __init__(self, status: int, code: int, message: str, errors: JSON | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: JSON = {"message": message, "code": code}
        if errors is not None:
            self.body["errors"] = errors


class DiscordRest(DiscordState):
    """The ``/api/v10/...`` handler, its routes and ``/attachments/...``."""

    # -- failing --------------------------------------------------------------------------------

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
            queue.append(Failure(status, body, retry_after if status == 429 else None,
                                 drop, after_commit))

    def malform_next(self, route: str, missing: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``route`` do their work (a message is created) but
        answer 200 with a body that lacks the field ``missing``."""
        self._malformed.setdefault(route, deque()).extend([missing] * times)

    # -- routing --------------------------------------------------------------------------------

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
        ("DELETE", "channels/{}/messages/{}", "delete_message"),
        ("PUT", "channels/{}/messages/{}/reactions/{e}/@me", "add_reaction"),
        ("DELETE", "channels/{}/messages/{}/reactions/{e}/@me", "remove_reaction"),
        ("POST", "channels/{}/typing", "typing"),
    )

    @classmethod
    def _route(cls, method: str, path: str) -> tuple[str, list[Any]] | None:
        parts = path.strip("/").split("/")
        for want_method, pattern, name in cls._ROUTES:
            want = pattern.split("/")
            if want_method != method or len(want) != len(parts):
                continue
            ids: list[Any] = []
            for w, p in zip(want, parts, strict=True):
                if w == "{}" and p.isdigit():
                    ids.append(int(p))
                elif w == "{e}":  # an emoji, URL-encoded
                    ids.append(unquote(p))
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
            malformed = self._malformed.get(name)
            if malformed and isinstance(result, dict):
                missing = malformed.popleft()
                result = {k: v for k, v in result.items() if k != missing}
            if result is None:
                return web.Response(status=204)
            return _json(200, result)
        except ApiError as exc:
            return _json(exc.status, exc.body)
        finally:
            await self._notify()

    def _next_failure(self, route: str) -> Failure | None:
        queue = self._failures.get(route)
        return queue.popleft() if queue else None

    @staticmethod
    def _fail(request: web.Request, failure: Failure) -> web.StreamResponse:
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
        msg["edited_timestamp"] = now_iso()
        self.dispatch("MESSAGE_UPDATE", msg)
        return msg

    async def _r_delete_message(self, request: web.Request, channel_id: int,
                                message_id: int) -> None:
        self._channel(channel_id)
        msg = self.messages.get(message_id)
        if msg is None or int(msg["channel_id"]) != channel_id:
            raise ApiError(404, 10008, "Unknown Message")
        del self.messages[message_id]
        sent = next((s for s in self.sent if s.message_id == message_id), None)
        if sent is not None:
            self.sent.remove(sent)
            self.deleted.append(sent)
        self.dispatch("MESSAGE_DELETE", {"id": str(message_id), "channel_id": str(channel_id)})

    async def _r_add_reaction(self, request: web.Request, channel_id: int,
                              message_id: int, emoji: str) -> None:
        self._channel(channel_id)
        if message_id not in self.messages:
            raise ApiError(404, 10008, "Unknown Message")
        self.reactions.setdefault(message_id, []).append(emoji)
        self.reaction_log.append(("add", message_id, emoji))

    async def _r_remove_reaction(self, request: web.Request, channel_id: int,
                                 message_id: int, emoji: str) -> None:
        self._channel(channel_id)
        mine = self.reactions.get(message_id, [])
        if emoji in mine:
            mine.remove(emoji)
        self.reaction_log.append(("remove", message_id, emoji))


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    """Discord's JSON answer: discord.py parses a body only when the content type is exactly
    ``application/json`` (aiohttp's ``json_response`` would add ``; charset=utf-8``)."""
    return web.Response(status=status, body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json", **(headers or {})})
