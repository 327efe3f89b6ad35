"""The fake Telegram's world: chats, the queue of updates waiting for getUpdates (or the
webhook), files, what the bot sent, and the waits tests use.

Separate from the Bot API methods (``telegram_methods``), which build on ``TelegramState``;
``FakeTelegram`` in ``telegram_server`` adds the server's lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.telegram_html import utf16_len

JSON = dict[str, Any]
TOKEN = "123456:TEST-token-never-log-me"
TEXT_LIMIT = 4096
MAX_DOWNLOAD = 20 * 1024 * 1024


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
class Failure:
    """A scripted failure of the next call of one method (``fail_next``)."""

    status: int
    description: str
    retry_after: int | None = None
    drop: bool = False


class TelegramState:
    """Everything the fake knows; the Bot API methods read and change it."""

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
        self._failures: dict[str, deque[Failure]] = {}
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
        self.conflicts = 0
        """getUpdates calls ended with 409 by a newer one (two pollers of one token)."""
        self.stalled_polls = 0
        self.gone = False
        """While True, every call's connection closes without an answer (``set_gone``)."""
        self.gone_calls: dict[str, int] = {}
        """Calls per method that found the API gone."""
        self._malformed: dict[str, deque[str]] = {}
        self.drafts: list[tuple[int, int, str]] = []
        """Drafts shown (``sendMessageDraft``): chat, draft id, visible text."""
        self.drafts_offered = True
        self.deleted: list[Sent] = []
        self.reactions: list[tuple[int, int, list[str]]] = []
        """``setMessageReaction`` calls: chat, message, the emoji set (empty: removed)."""

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

    # -- inspecting -----------------------------------------------------------------------------

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
