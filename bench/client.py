"""A client of the local channel's HTTP API, as a script would use it.

A turn's latency runs from just before ``POST /v1/messages`` to the moment the long poll
(``GET /v1/messages?wait=``), already waiting when the POST goes out, returns the answer.
Progress lines (tool notices) are skipped; ``reply``, ``notice`` and ``error`` end a turn.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, Self

import aiohttp

ANSWER_KINDS = frozenset({"reply", "notice", "error"})


class TurnFailed(Exception):
    """A turn got no answer, or an answer other than the expected one."""


class LocalClient:
    def __init__(self, base_url: str, *, wait: float = 30.0) -> None:
        self.base_url = base_url
        self.wait = wait
        self.after: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        # No connection limit: 100 chats each hold a long poll and a POST at once.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.wait + 30))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use LocalClient as an async context manager"
        return self._session

    async def post(self, chat_id: str, text: str) -> str:
        body = {"chat_id": chat_id, "sender_id": "bench", "text": text}
        async with self.session.post(f"{self.base_url}/v1/messages", json=body) as resp:
            data = await resp.json()
            if resp.status != 202:
                raise TurnFailed(f"POST answered {resp.status}: {data}")
            return str(data["message_id"])

    async def answer(self, chat_id: str, after: int) -> dict[str, Any]:
        """The first reply, notice or error in ``chat_id`` after ``after``."""
        while True:
            params = {"chat_id": chat_id, "after": str(after), "wait": str(self.wait)}
            async with self.session.get(f"{self.base_url}/v1/messages", params=params) as resp:
                data = await resp.json()
            if not data["messages"]:
                raise TurnFailed(f"no answer in chat {chat_id} within {self.wait} s")
            for record in data["messages"]:
                if record["kind"] in ANSWER_KINDS:
                    self.after[chat_id] = int(record["seq"])
                    return dict(record)
            after = int(data["next"])

    async def turn(self, chat_id: str, text: str) -> tuple[float, dict[str, Any]]:
        """Send ``text`` and wait for its answer: (seconds, answer record)."""
        waiter = asyncio.create_task(self.answer(chat_id, self.after.get(chat_id, 0)),
                                     name=f"poll:{chat_id}")
        started = time.perf_counter()
        try:
            await self.post(chat_id, text)
            record = await waiter
        finally:
            if not waiter.done():
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)
        return time.perf_counter() - started, record


def expect(record: dict[str, Any], text: str) -> None:
    """The scripted model echoes plain turns and ends tool turns with ``done:``."""
    if record["kind"] != "reply":
        raise TurnFailed(f"{record['kind']}: {record['text']!r}")
    wanted = "done: " if text.startswith("tool:") else f"echo: {text}"
    if not record["text"].startswith(wanted):
        raise TurnFailed(f"expected {wanted!r}, got {record['text']!r}")
