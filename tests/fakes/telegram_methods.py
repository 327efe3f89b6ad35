"""The fake Telegram's Bot API: ``POST {base_url}{token}/{method}`` with form, JSON or
multipart bodies, answered as ``{"ok": ..., "result"}`` or Telegram's error wording; scripted
failures (``fail_next``); every method the adapter calls; and file downloads.

Separate from the world the methods act on (``telegram_state``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.telegram_html import HtmlError, parse_html, utf16_len
from tests.fakes.telegram_state import JSON, MAX_DOWNLOAD, TEXT_LIMIT, Failure, Sent, TelegramState

REACTION_EMOJI = frozenset((
    "👍 👎 ❤ 🔥 🥰 👏 😁 🤔 🤯 😱 🤬 😢 "
    "🎉 🤩 🤮 💩 🙏 👌 🕊 🤡 🥱 🥴 😍 🐳 "
    "❤‍🔥 🌚 🌭 💯 🤣 ⚡ 🍌 🏆 💔 🤨 😐 🍓 "
    "🍾 💋 🖕 😈 😴 😭 🤓 👻 👨‍💻 👀 🎃 🙈 "
    "😇 😨 🤝 ✍ 🤗 🫡 🎅 🎄 ☃ 💅 🤪 🗿 "
    "🆒 💘 🙉 🦄 😘 💊 🙊 😎 👾 🤷‍♂ 🤷 🤷‍♀ "
    "😡 ").split())
"""The emoji a bot may react with (``ReactionTypeEmoji``); Telegram refuses others."""


class ApiError(Exception):
    """A Bot API error: ``error_code``, ``description`` and optional ``parameters``."""

    def __init__(self, code: int, description: str, parameters: JSON | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.parameters = parameters


class TelegramMethods(TelegramState):
    """The Bot API handler, its methods and file downloads."""

    # -- failing --------------------------------------------------------------------------------

    def fail_next(self, method: str, status: int = 429, *, retry_after: int | None = None,
                  description: str | None = None, times: int = 1, drop: bool = False) -> None:
        """The next ``times`` calls of ``method`` fail: 429 (with ``retry_after``), any error
        status with Telegram's wording, or ``drop=True``: the connection closes, no answer."""
        if description is None:
            description = {429: f"Too Many Requests: retry after {retry_after or 1}",
                           400: "Bad Request: can't parse entities: Unsupported start tag",
                           403: "Forbidden: bot was blocked by the user",
                           500: "Internal Server Error", 502: "Bad Gateway"}.get(
                status, "Internal Server Error")
        if status == 429 and retry_after is None:
            retry_after = 1
        queue = self._failures.setdefault(method, deque())
        for _ in range(times):
            queue.append(Failure(status, description, retry_after, drop))

    def malform_next(self, method: str, missing: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` do their work (a message is stored) but
        answer ``ok`` with a result that lacks the field ``missing``."""
        self._malformed.setdefault(method, deque()).extend([missing] * times)

    async def set_gone(self, gone: bool) -> None:
        """The API goes away (True: every call's connection closes unanswered, counted in
        ``gone_calls``) or comes back."""
        async with self._changed:
            self.gone = gone
            self._poll_generation += 1  # a long poll in flight ends too
            self._changed.notify_all()

    # -- HTTP -----------------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        method = request.match_info["method"]
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return _error(404, "Not Found")
        params, files = await _params(request)
        self.calls.append((method, params))
        try:
            if self.gone:  # the API went away: every connection closes without an answer
                self.gone_calls[method] = self.gone_calls.get(method, 0) + 1
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            failures = self._failures.get(method)
            if failures:
                failure = failures.popleft()
                if failure.drop:
                    assert request.transport is not None
                    request.transport.close()
                    return web.Response()
                extra = {"retry_after": failure.retry_after} if failure.retry_after else None
                return _error(failure.status, failure.description, extra)
            result = await handler(params, files)
            malformed = self._malformed.get(method)
            if malformed and isinstance(result, dict):
                missing = malformed.popleft()
                result = {k: v for k, v in result.items() if k != missing}
        except ApiError as exc:
            return _error(exc.code, exc.description, exc.parameters)
        finally:
            await self._notify()
        return web.json_response({"ok": True, "result": result})

    async def _download(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        wanted = request.match_info["path"]
        for path, data in self.files.values():
            if path == wanted:
                return web.Response(body=data)
        return _error(404, "Not Found")

    # -- methods --------------------------------------------------------------------------------

    async def _m_getMe(self, params: JSON, files: JSON) -> JSON:
        return self.bot

    async def _m_getUpdates(self, params: JSON, files: JSON) -> list[JSON]:
        if self.webhook is not None:
            raise ApiError(409, "Conflict: can't use getUpdates method while webhook is active; "
                                "use deleteWebhook to delete the webhook first")
        offset = int(params.get("offset") or 0)
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        async with self._changed:
            self._poll_generation += 1
            generation = self._poll_generation
            self._changed.notify_all()
            if offset:
                self.updates = [u for u in self.updates if u["update_id"] >= offset]

            def ready() -> bool:
                return generation != self._poll_generation or (
                    not self.stall_updates and bool(self.updates))

            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(ready)
            except TimeoutError:
                pass
            if self.stall_updates:  # a dead connection: no answer until superseded or lifted
                self.stalled_polls += 1
                self._changed.notify_all()
                await self._changed.wait_for(
                    lambda: generation != self._poll_generation or not self.stall_updates)
            if generation != self._poll_generation:
                self.conflicts += 1
                raise ApiError(409, "Conflict: terminated by other getUpdates request; make sure "
                                    "that only one bot instance is running")
            self.completed_polls += 1
            return self.updates[:limit]

    async def _m_deleteWebhook(self, params: JSON, files: JSON) -> bool:
        self.webhook = None
        if _bool(params.get("drop_pending_updates")):
            self.updates.clear()
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            self._webhook_task = None
        return True

    async def _m_setWebhook(self, params: JSON, files: JSON) -> bool:
        self.webhook = {"url": params["url"], "secret_token": params.get("secret_token")}
        if self._webhook_task is None:
            self._webhook_task = asyncio.create_task(self._push_webhook(), name="fake-webhook")
        return True

    async def _m_getWebhookInfo(self, params: JSON, files: JSON) -> JSON:
        return {"url": self.webhook["url"] if self.webhook else "", "has_custom_certificate":
                False, "pending_update_count": len(self.updates)}

    async def _push_webhook(self) -> None:
        """Deliver queued updates to the webhook, one at a time, until each gets a 200."""
        async with aiohttp.ClientSession() as session:
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda: bool(self.updates and self.webhook))
                    update, hook = self.updates[0], dict(self.webhook or {})
                headers = {"X-Telegram-Bot-Api-Secret-Token": hook.get("secret_token") or ""}
                try:
                    async with session.post(hook["url"], json=update, headers=headers) as resp:
                        delivered = resp.status == 200
                except aiohttp.ClientError:
                    delivered = False
                async with self._changed:
                    if delivered and self.updates and self.updates[0] is update:
                        self.updates.pop(0)
                    self._changed.notify_all()
                    if not delivered:  # Telegram retries later; here, when something changes
                        try:
                            async with asyncio.timeout(0.2):
                                await self._changed.wait()
                        except TimeoutError:
                            pass

    async def _m_setMyCommands(self, params: JSON, files: JSON) -> bool:
        self.commands = json.loads(params["commands"])
        return True

    async def _m_getMyCommands(self, params: JSON, files: JSON) -> list[JSON]:
        return self.commands or []

    async def _m_sendChatAction(self, params: JSON, files: JSON) -> bool:
        chat_id = self._chat(params)
        thread = params.get("message_thread_id")
        self.actions.append((chat_id, params["action"], int(thread) if thread else None))
        return True

    def _chat(self, params: JSON) -> int:
        try:
            chat_id = int(params.get("chat_id", ""))
        except ValueError:
            raise ApiError(400, "Bad Request: chat not found") from None
        if chat_id not in self.chats:
            raise ApiError(400, "Bad Request: chat not found")
        if chat_id in self.blocked:
            raise ApiError(403, "Forbidden: bot was blocked by the user")
        return chat_id

    @staticmethod
    def _visible(text: str, parse_mode: str | None) -> str:
        if parse_mode and parse_mode.upper() == "HTML":
            try:
                text = parse_html(text)
            except HtmlError as exc:
                raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
        if not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > TEXT_LIMIT:
            raise ApiError(400, "Bad Request: message is too long")
        return text

    def _reply_and_thread(self, params: JSON) -> tuple[int | None, int | None]:
        reply = params.get("reply_parameters")
        reply_to = json.loads(reply)["message_id"] if reply else None
        if reply_to is None and params.get("reply_to_message_id"):
            reply_to = int(params["reply_to_message_id"])
        thread = params.get("message_thread_id")
        return reply_to, int(thread) if thread else None

    def _message_json(self, sent: Sent) -> JSON:
        out: JSON = {"message_id": sent.message_id, "from": self.bot,
                     "chat": self.chats[sent.chat_id], "date": int(time.time())}
        if sent.method in ("sendMessage", "editMessageText"):
            out["text"] = sent.text
        elif sent.text:
            out["caption"] = sent.text
        if sent.thread_id is not None:
            out["message_thread_id"] = sent.thread_id
            out["is_topic_message"] = True
        return out

    async def _m_sendMessage(self, params: JSON, files: JSON) -> JSON:
        chat_id = self._chat(params)
        raw = params.get("text", "")
        text = self._visible(raw, params.get("parse_mode"))
        reply_to, thread = self._reply_and_thread(params)
        sent = Sent("sendMessage", chat_id, self._next_message_id(chat_id), text, raw,
                    params.get("parse_mode"), reply_to, thread)
        self.sent.append(sent)
        return self._message_json(sent)

    async def _m_editMessageText(self, params: JSON, files: JSON) -> JSON:
        chat_id = self._chat(params)
        message_id = int(params.get("message_id") or 0)
        sent = next((s for s in self.sent if s.chat_id == chat_id and
                     s.message_id == message_id), None)
        if sent is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        text = self._visible(params.get("text", ""), params.get("parse_mode"))
        if text == sent.text:
            raise ApiError(400, "Bad Request: message is not modified: specified new message "
                                "content and reply markup are exactly the same as a current "
                                "content and reply markup of the message")
        sent.edits.append(sent.text)
        sent.text, sent.raw = text, params.get("text", "")
        return self._message_json(sent)

    async def _m_sendMessageDraft(self, params: JSON, files: JSON) -> bool:
        """Bot API 9.3: a draft in a private chat, animated while it grows; it leaves
        nothing in the chat. ``drafts_offered = False`` plays a server without it."""
        if not self.drafts_offered:
            raise ApiError(404, "Not Found: method not found")
        chat_id = self._chat(params)
        if self.chats[chat_id].get("type") != "private":
            raise ApiError(400, "Bad Request: drafts can be sent to private chats only")
        if not int(params.get("draft_id") or 0):
            raise ApiError(400, "Bad Request: draft_id must be non-zero")
        text = self._visible(params.get("text", ""), params.get("parse_mode"))
        self.drafts.append((chat_id, int(params["draft_id"]), text))
        return True

    async def _m_deleteMessage(self, params: JSON, files: JSON) -> bool:
        chat_id = self._chat(params)
        message_id = int(params.get("message_id") or 0)
        sent = next((s for s in self.sent if s.chat_id == chat_id and
                     s.message_id == message_id), None)
        if sent is None:
            raise ApiError(400, "Bad Request: message to delete not found")
        self.sent.remove(sent)
        self.deleted.append(sent)
        return True

    async def _m_setMessageReaction(self, params: JSON, files: JSON) -> bool:
        chat_id = self._chat(params)
        message_id = int(params.get("message_id") or 0)
        kinds = json.loads(params.get("reaction") or "[]")
        emoji = [r["emoji"] for r in kinds if r.get("type") == "emoji"]
        if any(e not in REACTION_EMOJI for e in emoji):
            raise ApiError(400, "Bad Request: REACTION_INVALID")
        self.reactions.append((chat_id, message_id, emoji))
        return True

    async def _send_file(self, method: str, field_name: str, params: JSON, files: JSON) -> JSON:
        chat_id = self._chat(params)
        upload = files.get(field_name)
        if upload is None and not params.get(field_name):
            raise ApiError(400, f"Bad Request: there is no {field_name} in the request")
        caption = params.get("caption", "")
        if caption and params.get("parse_mode"):
            caption = self._visible(caption, params.get("parse_mode"))
        reply_to, thread = self._reply_and_thread(params)
        data, filename = upload if upload is not None else (None, params.get(field_name))
        sent = Sent(method, chat_id, self._next_message_id(chat_id), caption, caption,
                    params.get("parse_mode"), reply_to, thread, data, filename)
        self.sent.append(sent)
        out = self._message_json(sent)
        file_id, uid = self.add_file(data or b"", f"sent/{filename}")
        size = len(data or b"")
        if field_name == "photo":
            out["photo"] = [{"file_id": file_id, "file_unique_id": uid, "width": 640,
                             "height": 480, "file_size": size}]
        elif field_name == "voice":
            out["voice"] = {"file_id": file_id, "file_unique_id": uid, "duration": 1,
                            "mime_type": "audio/ogg", "file_size": size}
        else:
            out["document"] = {"file_id": file_id, "file_unique_id": uid,
                               "file_name": filename, "file_size": size}
        return out

    async def _m_sendPhoto(self, params: JSON, files: JSON) -> JSON:
        return await self._send_file("sendPhoto", "photo", params, files)

    async def _m_sendDocument(self, params: JSON, files: JSON) -> JSON:
        return await self._send_file("sendDocument", "document", params, files)

    async def _m_sendVoice(self, params: JSON, files: JSON) -> JSON:
        return await self._send_file("sendVoice", "voice", params, files)

    async def _m_getFile(self, params: JSON, files: JSON) -> JSON:
        found = self.files.get(params.get("file_id", ""))
        if found is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        path, data = found
        if len(data) > MAX_DOWNLOAD:
            raise ApiError(400, "Bad Request: file is too big")
        file_id = params["file_id"]
        return {"file_id": file_id, "file_unique_id": f"u-{file_id}", "file_size": len(data),
                "file_path": path}


def _bool(value: Any) -> bool:
    return str(value).lower() in ("true", "1")


def _error(code: int, description: str, parameters: JSON | None = None) -> web.Response:
    body: JSON = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=code)


async def _params(request: web.Request) -> tuple[JSON, JSON]:
    """Form fields (PTB JSON-encodes non-string values) and uploaded files (bytes, name)."""
    params: JSON = dict(request.query)
    files: JSON = {}
    if request.method == "POST":
        if request.content_type == "application/json":
            params.update({k: v if isinstance(v, str) else json.dumps(v)
                           for k, v in (await request.json()).items()})
        else:
            for key, value in (await request.post()).items():
                if isinstance(value, web.FileField):
                    files[key] = (value.file.read(), value.filename)
                else:
                    params[key] = value
    return params, files
