"""A fake Telegram Bot API server on loopback that python-telegram-bot really talks to.

Why: mocking PTB would test our mocks; this server speaks the Bot API's wire format instead
(``POST {base_url}{token}/{method}`` with form or multipart bodies, ``{"ok": ..., "result"}``
answers, Telegram's error wording), so the real library runs end to end: its request building,
JSON parsing and error mapping (``BadRequest``, ``RetryAfter``, ``Forbidden``, ...).

    async with FakeTelegram() as tg:
        config = {"token": tg.token, "base_url": tg.base_url, "base_file_url": tg.base_file_url}
        ada = tg.user(1001, "Ada", username="ada")
        tg.dm(ada, "hello")                       # queued for getUpdates
        [reply] = await tg.wait_sent(ada["id"])    # what the bot sent to that chat

Implemented: getMe, getUpdates (long poll, offsets confirm, a newer call ends an older one
with 409 as Telegram does), setWebhook/deleteWebhook/getWebhookInfo (with delivery of queued
updates to the webhook URL), sendMessage and editMessageText (empty text, over 4096 UTF-16
units after entity parsing, and HTML Telegram cannot parse are refused with its wording),
sendChatAction, sendPhoto/sendDocument (multipart uploads, file ids or URLs), getFile and file
downloads, setMyCommands/getMyCommands. ``fail_next()`` injects 429 with ``retry_after``, 5xx
or a dropped connection; ``stall_updates`` makes getUpdates hang like a dead connection.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

__all__ = ["FakeTelegram", "Sent", "TOKEN", "parse_html"]

JSON = dict[str, Any]
TOKEN = "123456:TEST-token-never-log-me"
TEXT_LIMIT = 4096
MAX_DOWNLOAD = 20 * 1024 * 1024
_TAGS = frozenset({"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre",
                   "a", "blockquote", "tg-spoiler", "span", "tg-emoji"})
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[A-Za-z-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'"
                  r"|[^\s>]+))*)\s*(/?)>")
_ENTITY = re.compile(r"&(#[0-9]+|#x[0-9A-Fa-f]+|[A-Za-z]+);")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class ApiError(Exception):
    def __init__(self, code: int, description: str, parameters: JSON | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.parameters = parameters


class HtmlError(ValueError):
    pass


def parse_html(text: str) -> str:
    """The visible text of a message in Telegram's HTML parse mode, or HtmlError with
    Telegram's wording (the part after "can't parse entities: ")."""
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        offset = len(text[:i].encode())
        if ch == "<":
            m = _TAG.match(text, i)
            if m is None:
                raise HtmlError(f'Unsupported start tag "" at byte offset {offset}')
            closing, name = m.group(1) == "/", m.group(2).lower()
            if closing:
                if not stack:
                    raise HtmlError(f"Unexpected end tag at byte offset {offset}")
                if stack[-1] != name:
                    raise HtmlError(f'Unmatched end tag at byte offset {offset}, expected '
                                    f'"</{stack[-1]}>", found "</{name}>"')
                stack.pop()
            else:
                if name not in _TAGS:
                    raise HtmlError(f'Unsupported start tag "{name}" at byte offset {offset}')
                if stack and stack[-1] in ("code", "pre") and not (
                        stack[-1] == "pre" and name == "code"):
                    raise HtmlError(f'Unsupported start tag "{name}" at byte offset {offset}')
                if name == "a" and "href" not in m.group(3):
                    raise HtmlError(f"Empty href at byte offset {offset}")
                stack.append(name)
            i = m.end()
        elif ch == "&" and (m := _ENTITY.match(text, i)) is not None:
            body = m.group(1)
            if body.startswith("#x"):
                out.append(chr(int(body[2:], 16)))
            elif body.startswith("#"):
                out.append(chr(int(body[1:])))
            elif body in _NAMED:
                out.append(_NAMED[body])
            else:
                raise HtmlError(f'Unsupported HTML entity "&{body};" at byte offset {offset}')
            i = m.end()
        else:
            out.append(ch)
            i += 1
    if stack:
        raise HtmlError(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)


@dataclass(slots=True)
class Sent:
    """One message the bot sent (or edited), as the fake recorded it."""

    method: str
    chat_id: int
    message_id: int
    text: str
    """What the reader sees: the text after entity parsing, or the caption."""
    raw: str
    parse_mode: str | None = None
    reply_to: int | None = None
    thread_id: int | None = None
    data: bytes | None = None
    filename: str | None = None
    edits: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Failure:
    status: int
    description: str
    retry_after: int | None = None
    drop: bool = False


class FakeTelegram:
    def __init__(self, *, token: str = TOKEN, bot_id: int = 777000111,
                 bot_username: str = "parley_bot", host: str = "127.0.0.1") -> None:
        self.token = token
        self.bot = {"id": bot_id, "is_bot": True, "first_name": "Parley",
                    "username": bot_username, "can_join_groups": True,
                    "can_read_all_group_messages": False, "supports_inline_queries": False}
        self._host = host
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._changed = asyncio.Condition()
        self._update_ids = itertools.count(1)
        self._message_ids: dict[int, itertools.count[int]] = {}
        self._file_ids = itertools.count(1)
        self._poll_generation = 0
        self._failures: dict[str, deque[_Failure]] = {}
        self._webhook_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.chats: dict[int, JSON] = {}
        self.updates: list[JSON] = []
        """Updates not yet confirmed by an offset (nor delivered to a webhook)."""
        self.sent: list[Sent] = []
        self.actions: list[tuple[int, str, int | None]] = []
        self.commands: list[JSON] | None = None
        self.calls: list[tuple[str, JSON]] = []
        """Every API call: (method, parameters), files left out."""
        self.files: dict[str, tuple[str, bytes]] = {}
        self.webhook: JSON | None = None
        self.blocked: set[int] = set()
        self.stall_updates = False
        """While True, getUpdates never answers (a long poll on a dead connection)."""
        self.completed_polls = 0
        self.stalled_polls = 0

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, 0).start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def set_stall(self, stalled: bool) -> None:
        """Make getUpdates hang (True) like a dead connection, or answer again (False)."""
        async with self._changed:
            self.stall_updates = stalled
            self._changed.notify_all()

    async def stop(self) -> None:
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            await asyncio.gather(self._webhook_task, return_exceptions=True)
            self._webhook_task = None
        runner, self._runner = self._runner, None
        if runner is not None:
            async with self._changed:
                self._poll_generation += 1  # wake every long poll
                self.stall_updates = False
                self._changed.notify_all()
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
    def base_url(self) -> str:
        return f"{self.root}/bot"

    @property
    def base_file_url(self) -> str:
        return f"{self.root}/file/bot"

    # -- building updates -----------------------------------------------------------------------

    @staticmethod
    def user(user_id: int, first_name: str, *, username: str | None = None,
             last_name: str | None = None) -> JSON:
        out: JSON = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            out["username"] = username
        if last_name:
            out["last_name"] = last_name
        return out

    def group(self, chat_id: int, title: str, *, forum: bool = False,
              username: str | None = None) -> JSON:
        chat: JSON = {"id": chat_id, "type": "supergroup", "title": title}
        if forum:
            chat["is_forum"] = True
        if username:
            chat["username"] = username
        self.chats[chat_id] = chat
        return chat

    def private(self, user: JSON) -> JSON:
        chat = {"id": user["id"], "type": "private", "first_name": user["first_name"]}
        if "username" in user:
            chat["username"] = user["username"]
        self.chats[user["id"]] = chat
        return chat

    def _next_message_id(self, chat_id: int) -> int:
        return next(self._message_ids.setdefault(chat_id, itertools.count(1)))

    @staticmethod
    def entities(text: str) -> list[JSON]:
        """Entities Telegram would find: @mentions and a leading /command (UTF-16 offsets)."""
        out = []
        for m in re.finditer(r"(?<![\w@])@[A-Za-z0-9_]{3,}", text):
            out.append({"type": "mention", "offset": utf16_len(text[:m.start()]),
                        "length": utf16_len(m.group())})
        command = re.match(r"/[A-Za-z0-9_]+(@[A-Za-z0-9_]+)?", text)
        if command:
            out.append({"type": "bot_command", "offset": 0,
                        "length": utf16_len(command.group())})
        return sorted(out, key=lambda e: e["offset"])

    def message(self, chat: JSON, user: JSON, text: str | None = None, *,
                reply_to: JSON | None = None, thread_id: int | None = None,
                **extra: Any) -> JSON:
        """Queue a message update from ``user`` in ``chat``; returns the message."""
        self.chats[chat["id"]] = chat
        msg: JSON = {"message_id": self._next_message_id(chat["id"]), "from": user,
                     "chat": chat, "date": int(time.time()), **extra}
        if text is not None:
            key = "caption" if any(k in extra for k in ("photo", "document", "voice")) else "text"
            msg[key] = text
            if ents := self.entities(text):
                msg["caption_entities" if key == "caption" else "entities"] = ents
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            msg["is_topic_message"] = True
        if reply_to is not None:
            msg["reply_to_message"] = reply_to
        self._queue({"message": msg})
        return msg

    def dm(self, user: JSON, text: str, **extra: Any) -> JSON:
        return self.message(self.private(user), user, text, **extra)

    def bot_message(self, chat_id: int, message_id: int) -> JSON:
        """A message of the bot's, as it appears in ``reply_to_message``."""
        chat = self.chats[chat_id]
        sent = next(s for s in self.sent if s.chat_id == chat_id and s.message_id == message_id)
        return {"message_id": message_id, "from": self.bot, "chat": chat,
                "date": int(time.time()), "text": sent.text}

    def add_file(self, data: bytes, path: str, *, size: int | None = None) -> tuple[str, str]:
        """Store a downloadable file; returns (file_id, file_unique_id)."""
        n = next(self._file_ids)
        file_id = f"file-{n}"
        self.files[file_id] = (path, data)
        return file_id, f"uniq-{n}"

    def photo(self, chat: JSON, user: JSON, data: bytes, caption: str | None = None,
              *, size: int | None = None, **extra: Any) -> JSON:
        """A photo message: a small thumbnail and the full-size picture, like Telegram's."""
        thumb_id, thumb_uid = self.add_file(b"thumb", "photos/thumb.jpg")
        big_id, big_uid = self.add_file(data, f"photos/file_{len(self.files)}.jpg")
        sizes = [{"file_id": thumb_id, "file_unique_id": thumb_uid, "width": 90, "height": 60,
                  "file_size": 5},
                 {"file_id": big_id, "file_unique_id": big_uid, "width": 1280, "height": 853,
                  "file_size": size if size is not None else len(data)}]
        return self.message(chat, user, caption, photo=sizes, **extra)

    def document(self, chat: JSON, user: JSON, data: bytes, file_name: str, mime: str,
                 caption: str | None = None, *, size: int | None = None) -> JSON:
        file_id, uid = self.add_file(data, f"documents/{file_name}")
        doc = {"file_id": file_id, "file_unique_id": uid, "file_name": file_name,
               "mime_type": mime, "file_size": size if size is not None else len(data)}
        return self.message(chat, user, caption, document=doc)

    def voice(self, chat: JSON, user: JSON, data: bytes) -> JSON:
        file_id, uid = self.add_file(data, f"voice/file_{len(self.files)}.oga")
        voice = {"file_id": file_id, "file_unique_id": uid, "duration": 2,
                 "mime_type": "audio/ogg", "file_size": len(data)}
        return self.message(chat, user, None, voice=voice)

    def _queue(self, update: JSON) -> None:
        update["update_id"] = next(self._update_ids)
        self.updates.append(update)
        task = asyncio.get_running_loop().create_task(self._notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- inspecting and failing -----------------------------------------------------------------

    def sent_to(self, chat_id: int) -> list[Sent]:
        return [s for s in self.sent if s.chat_id == chat_id]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_sent(self, chat_id: int, n: int = 1, timeout: float = 10.0) -> list[Sent]:
        """The first ``n`` messages sent to ``chat_id``, waiting for them to arrive."""
        try:
            await self.wait_for(lambda: len(self.sent_to(chat_id)) >= n, timeout)
        except TimeoutError:
            raise AssertionError(f"{len(self.sent_to(chat_id))} of {n} message(s) to chat "
                                 f"{chat_id} within {timeout}s: "
                                 f"{[s.text for s in self.sent_to(chat_id)]}") from None
        return self.sent_to(chat_id)[:n]

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
            queue.append(_Failure(status, description, retry_after, drop))

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
        else:
            out["document"] = {"file_id": file_id, "file_unique_id": uid,
                               "file_name": filename, "file_size": size}
        return out

    async def _m_sendPhoto(self, params: JSON, files: JSON) -> JSON:
        return await self._send_file("sendPhoto", "photo", params, files)

    async def _m_sendDocument(self, params: JSON, files: JSON) -> JSON:
        return await self._send_file("sendDocument", "document", params, files)

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

