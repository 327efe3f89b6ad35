"""The skeleton: the least a turn costs in Python with the gateway's own I/O, for scale.

``python -m bench.skeleton <model base_url> <port> <database>`` serves the two requests of the
local channel a benchmark turn makes (``POST /v1/messages``, the long-polling ``GET``) and
nothing else: the inbound row committed before the 202; the turn: the chat's last 40 messages
from memory behind a fixed system prompt, one model call over a kept-alive HTTP/1.1
connection, the user and assistant messages, an outbox row and the inbound row's state
written in one transaction; then the waiting poll answered. The same libraries as the
gateway (uvloop, httptools, orjson, sqlite3 in WAL with ``synchronous=NORMAL``), the writes
of a loop pass gathered into one commit.

No context layers, token budget, memory, trust, snapshots, tools, streaming, retries, limits,
replay, costs, health or recovery: what it costs a turn is a floor under the gateway's, not a
rival. ``make bench`` runs it at 100 chats pinned as the gateway is (item 3's row "the same
I/O, nothing else") so the gateway's CPU a turn reads against it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httptools
import orjson

SYSTEM = "You are a helpful assistant in a chat. " * 200
"""A fixed system prompt about the size of the gateway's (~8 KB)."""
HISTORY = 40

Write = Callable[[sqlite3.Connection], object]


class Store:
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript("""
            CREATE TABLE IF NOT EXISTS inbox (id INTEGER PRIMARY KEY, chat_id TEXT NOT NULL,
                message_id TEXT NOT NULL UNIQUE, payload BLOB NOT NULL, done INTEGER DEFAULT 0);
            CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, chat_id TEXT NOT NULL,
                role TEXT NOT NULL, body BLOB NOT NULL, created_at REAL NOT NULL);
            CREATE INDEX IF NOT EXISTS messages_chat ON messages (chat_id, id);
            CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, chat_id TEXT NOT NULL,
                payload BLOB NOT NULL);
        """)
        self.pending: list[tuple[Write, asyncio.Future[None]]] = []

    def write(self, fn: Write) -> asyncio.Future[None]:
        """``fn`` in the next commit; the future is done once it is committed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if not self.pending:
            loop.call_soon(self._commit)
        self.pending.append((fn, done))
        return done

    def _commit(self) -> None:
        batch, self.pending = self.pending, []
        self.db.execute("BEGIN IMMEDIATE")
        for fn, _ in batch:
            fn(self.db)
        self.db.execute("COMMIT")
        for _, done in batch:
            done.set_result(None)


class _ModelConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[bytes] | None = None
        self.body: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("the model server closed"))

    def send(self, data: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.body = []
        self.transport.write(data)
        return self.answer

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.answer is not None
        self.answer.set_result(b"".join(self.body))


class Model:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = (b"POST " + parts.path.rstrip("/").encode() + b"/chat/completions HTTP/1.1"
                     b"\r\nHost: " + parts.netloc.encode() + b"\r\nAuthorization: Bearer x"
                     b"\r\nContent-Type: application/json\r\nContent-Length: ")
        self.idle: list[_ModelConnection] = []

    async def complete(self, messages: list[dict[str, Any]]) -> str:
        body = orjson.dumps({"model": "bench-model", "messages": messages, "max_tokens": 4096})
        conn = self.idle.pop() if self.idle else None
        if conn is None or conn.closed:
            _, conn = await asyncio.get_running_loop().create_connection(
                _ModelConnection, self.host, self.port)
        raw = await conn.send(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.idle.append(conn)
        return str(orjson.loads(raw)["choices"][0]["message"]["content"] or "")


class Skeleton:
    def __init__(self, store: Store, model: Model) -> None:
        self.store, self.model = store, model
        self.history: dict[str, deque[dict[str, str]]] = {}
        self.replies: dict[str, list[dict[str, Any]]] = {}
        self.waiting: dict[str, list[tuple[int, Callable[[bytes], None]]]] = {}
        self.seq = 0
        self.ids = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def post(self, body: bytes, answer: Callable[[int, bytes], None]) -> None:
        data = orjson.loads(body)
        chat_id, text = str(data["chat_id"]), str(data["text"])
        self.ids += 1
        message_id = f"m{self.ids}"
        stored = self.store.write(lambda db: db.execute(
            "INSERT INTO inbox (chat_id, message_id, payload) VALUES (?, ?, ?)",
            (chat_id, message_id, body)))

        def acknowledged(_: object) -> None:
            answer(202, orjson.dumps({"message_id": message_id}))
            task = asyncio.get_running_loop().create_task(self.turn(chat_id, message_id, text))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        stored.add_done_callback(acknowledged)

    async def turn(self, chat_id: str, message_id: str, text: str) -> None:
        history = self.history.setdefault(chat_id, deque(maxlen=HISTORY))
        user = {"role": "user", "content": text}
        reply = await self.model.complete([{"role": "system", "content": SYSTEM}, *history,
                                           user])
        assistant = {"role": "assistant", "content": reply}
        now = time.time()
        self.seq += 1
        record = {"seq": self.seq, "chat_id": chat_id, "text": reply, "kind": "reply",
                  "reply_to": message_id, "media": [], "created_at": now}
        rows = ((chat_id, "user", orjson.dumps(user), now),
                (chat_id, "assistant", orjson.dumps(assistant), now))
        out = orjson.dumps(record)

        def write(db: sqlite3.Connection) -> None:
            db.executemany("INSERT INTO messages (chat_id, role, body, created_at) "
                           "VALUES (?, ?, ?, ?)", rows)
            db.execute("INSERT INTO outbox (chat_id, payload) VALUES (?, ?)", (chat_id, out))
            db.execute("UPDATE inbox SET done = 1 WHERE message_id = ?", (message_id,))
        await self.store.write(write)
        history.extend((user, assistant))
        self.replies.setdefault(chat_id, []).append(record)
        for after, answer in self.waiting.pop(chat_id, ()):
            answer(self.since(chat_id, after))

    def poll(self, query: dict[str, str], answer: Callable[[int, bytes], None]) -> None:
        chat_id, after = query["chat_id"], int(query.get("after", 0))
        held = self.replies.get(chat_id)
        if held and held[-1]["seq"] > after:
            answer(200, self.since(chat_id, after))
            return
        def replied(body: bytes) -> None:
            timer.cancel()
            answer(200, body)

        def expire() -> None:
            if entry in self.waiting.get(chat_id, ()):
                self.waiting[chat_id].remove(entry)
                answer(200, self.since(chat_id, after))
        entry = (after, replied)
        self.waiting.setdefault(chat_id, []).append(entry)
        timer = asyncio.get_running_loop().call_later(float(query.get("wait", 0)), expire)

    def since(self, chat_id: str, after: int) -> bytes:
        held = [r for r in self.replies.get(chat_id, ()) if r["seq"] > after]
        return orjson.dumps({"messages": held, "next": held[-1]["seq"] if held else after})


class _Http(asyncio.Protocol):
    def __init__(self, skeleton: Skeleton) -> None:
        self.skeleton = skeleton
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.parser.get_method() == b"POST":
            self.skeleton.post(b"".join(self.body), self.answer)
        else:
            query = self.url.partition(b"?")[2].decode()
            self.skeleton.poll(dict(parse_qsl(query)), self.answer)

    def answer(self, status: int, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))


async def serve(base_url: str, port: int, database: str) -> None:
    skeleton = Skeleton(Store(database), Model(base_url))
    server = await asyncio.get_running_loop().create_server(lambda: _Http(skeleton),
                                                            "127.0.0.1", port)
    print(f"http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    import uvloop

    base_url, port, database = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        uvloop.run(serve(base_url, port, database))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
