"""A client of the local channel's HTTP API, as a script would use it.

A turn's latency runs from just before ``POST /v1/messages`` to the moment the long poll
(``GET /v1/messages?wait=``), already waiting when the POST goes out, returns the answer.
Progress lines (tool notices) are skipped; ``reply``, ``notice`` and ``error`` end a turn.

The HTTP under it is a small HTTP/1.1 client on asyncio protocols, not aiohttp: the client
shares a CPU with the model server while the gateway is measured, and aiohttp's request and
response objects cost ~1 ms of CPU a turn, enough to make the benchmark its own ceiling.
It keeps a pool of keep-alive connections to the one origin, with no limit (100 chats each
hold a long poll and a POST at once), writes each request as one byte string and reads
answers with httptools (llhttp, in C), framed by ``Content-Length`` or chunked. An answer
completes in the protocol's callbacks, which hand the connection back to the pool; a turn
waits on one future (its long poll's), with no task and no timer of its own.

A turn fails with ``TurnFailed`` when its POST is not answered 202 (at once: the long poll is
dropped) or the long poll ends empty; with ``TimeoutError`` when an answer takes longer than
``wait + 30`` s (aiohttp's total timeout before); with ``Disconnected`` (a ConnectionError)
or the connect's ``OSError`` when the gateway goes away. A pooled connection the gateway
closed while it sat idle is not a failure: the request goes again on a new one.
"""

from __future__ import annotations

import asyncio
import functools
import time
from types import TracebackType
from typing import Any, Protocol, Self, cast
from urllib.parse import quote, urlsplit

import httptools
import orjson

ANSWER_KINDS = frozenset({"reply", "notice", "error"})
READ_BUFFER = 256 * 1024
"""Bytes read from a connection at once, into one buffer all connections share."""
SWEEP_SECONDS = 1.0
"""How often requests past their deadline are looked for."""

Exchanged = tuple[int, bytes]
"""An answer's status and body."""
Answer = asyncio.Future[Exchanged]


class TurnFailed(Exception):
    """A turn got no answer, or an answer other than the expected one."""


class Disconnected(ConnectionError):
    """The gateway closed the connection before its answer was complete."""


class _Sink(Protocol):
    """Where an exchange's outcome goes: an ``Answer`` future, or a turn's ``_Posted``."""

    def done(self) -> bool: ...
    def set_result(self, result: Exchanged, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...
    def cancel(self) -> bool: ...


class _Posted:
    """A turn's POST, checked as its answer is read. A 202 wakes nothing; anything else fails
    the turn's long poll, which is what the turn waits on."""

    __slots__ = ("finished", "poll")

    def __init__(self, poll: Answer) -> None:
        self.poll = poll
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def set_result(self, result: Exchanged, /) -> None:
        self.finished = True
        try:
            _message_id(result)
        except TurnFailed as exc:
            self._fail(exc)
        except (ValueError, KeyError, TypeError) as exc:
            self._fail(TurnFailed(f"POST answered {result[0]} with {exc!r}"))

    def set_exception(self, exception: BaseException, /) -> None:
        self.finished = True
        self._fail(exception)

    def cancel(self) -> bool:
        self.finished = True
        return self.poll.cancel()

    def _fail(self, exception: BaseException) -> None:
        if not self.poll.done():
            self.poll.set_exception(exception)


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; carries one exchange at a time.

    A buffered protocol: the loop reads into the client's one buffer, where a plain
    protocol's read would allocate a fresh 256 KiB ``bytes`` for every answer."""

    def __init__(self, client: LocalClient) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.sink: _Sink | None = None
        self.request = b""
        self.reused = False
        self.deadline = 0.0
        self.received = 0
        self.body: list[bytes] = []

    def send(self, data: bytes, sink: _Sink, *, reused: bool) -> None:
        assert self.transport is not None
        self.sink, self.request, self.reused = sink, data, reused
        self.deadline = time.monotonic() + self.client.timeout
        self.received, self.body = 0, []
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def fail(self, error: BaseException) -> None:
        sink, self.sink = self.sink, None
        if sink is not None and not sink.done():
            sink.set_exception(error)
        self.close()

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.client.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.client.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self.sink is None:  # bytes nobody asked for: the connection is not reused
            self.close()
            return
        try:
            self.parser.feed_data(self.client.buffer[:nbytes])
        except httptools.HttpParserError as exc:
            self.fail(Disconnected(f"the gateway's answer is not HTTP/1.1 ({exc})"))

    def eof_received(self) -> None:
        self.closed = True  # not taken from the pool again; the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.connections.discard(self)
        sink, self.sink = self.sink, None
        if sink is None or sink.done():
            return
        if self.reused and not self.received:
            # A pooled connection the gateway closed while it sat idle: the request never
            # reached it, so it goes again, once, on a new connection.
            self.client.connect_and_send(self.request, sink)
        else:
            sink.set_exception(Disconnected("the gateway closed the connection"
                                            + (f" ({exc})" if exc else "")))

    # httptools' callbacks (only those defined are called: two an answer)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        sink = self.sink
        status = self.parser.get_status_code()  # still the answer's, as is its keep-alive
        if sink is None:
            return
        if status < 200:  # an interim answer (1xx): the real one follows
            self.body = []
            return
        self.sink = None
        if self.parser.should_keep_alive():
            self.client.idle.append(self)
        else:
            self.close()
        if not sink.done():
            body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            sink.set_result((status, body))


@functools.lru_cache(maxsize=8192)
def _quoted(chat_id: str) -> bytes:
    """A chat id as a query value (any character may be in one); the same few recur."""
    return quote(chat_id, safe="").encode()


def _message_id(answer: Exchanged) -> str:
    status, raw = answer
    if status != 202:
        raise TurnFailed(f"POST answered {status}: {raw.decode('utf-8', 'replace')}")
    return str(orjson.loads(raw)["message_id"])


class LocalClient:
    def __init__(self, base_url: str, *, wait: float = 30.0) -> None:
        self.base_url = base_url
        self.wait = wait
        self.after: dict[str, int] = {}
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url}: only http://host:port is spoken")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._path = (parts.path.rstrip("/") + "/v1/messages").encode()
        self._head = f"Host: {parts.netloc}\r\nUser-Agent: parley-bench\r\n".encode("latin-1")
        self.timeout = wait + 30  # what aiohttp's ClientTimeout(total=...) was
        self.idle: list[_Connection] = []
        """Keep-alive connections free for the next request; the last one used on top."""
        self.connections: set[_Connection] = set()
        self.buffer = memoryview(bytearray(READ_BUFFER))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._connecting: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        self._sweeper = self._loop.call_later(SWEEP_SECONDS, self._sweep)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in list(self._connecting):
            task.cancel()
        for conn in list(self.connections):
            conn.fail(Disconnected("the client is closed"))
        self.idle.clear()
        self._loop = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("use LocalClient as an async context manager")
        return self._loop

    async def post(self, chat_id: str, text: str) -> str:
        return _message_id(await self._request(self._message(chat_id, text)))

    async def answer(self, chat_id: str, after: int) -> dict[str, Any]:
        """The first reply, notice or error in ``chat_id`` after ``after``."""
        while True:
            polled = await self._request(self._poll(chat_id, after))
            record, after = self._answered(chat_id, polled)
            if record is not None:
                return record

    async def turn(self, chat_id: str, text: str) -> tuple[float, dict[str, Any]]:
        """Send ``text`` and wait for its answer: (seconds, answer record)."""
        poll = self._start(self._poll(chat_id, self.after.get(chat_id, 0)))
        started = time.perf_counter()
        self._send(self._message(chat_id, text), _Posted(poll))
        try:
            polled = await poll
        except BaseException:
            self._abandon(poll)
            raise
        record, after = self._answered(chat_id, polled)
        if record is None:
            record = await self.answer(chat_id, after)
        return time.perf_counter() - started, record

    # -- the API's requests and answers ---------------------------------------------------------

    def _message(self, chat_id: str, text: str) -> bytes:
        body = orjson.dumps({"chat_id": chat_id, "sender_id": "bench", "text": text})
        return b"POST %s HTTP/1.1\r\n%sContent-Type: application/json\r\nContent-Length: %d" \
               b"\r\n\r\n%s" % (self._path, self._head, len(body), body)

    def _poll(self, chat_id: str, after: int) -> bytes:
        return b"GET %s?chat_id=%s&after=%d&wait=%s HTTP/1.1\r\n%s\r\n" % (
            self._path, _quoted(chat_id), after, str(self.wait).encode(), self._head)

    def _answered(self, chat_id: str, polled: Exchanged) -> tuple[dict[str, Any] | None, int]:
        """A long poll's answer: (the record that ends the turn or None, where to go on)."""
        status, raw = polled
        if status != 200:
            raise TurnFailed(f"GET answered {status}: {raw.decode('utf-8', 'replace')}")
        data = orjson.loads(raw)
        if not data["messages"]:
            raise TurnFailed(f"no answer in chat {chat_id} within {self.wait} s")
        for record in data["messages"]:
            if record["kind"] in ANSWER_KINDS:
                self.after[chat_id] = int(record["seq"])
                return dict(record), int(record["seq"])
        return None, int(data["next"])

    # -- HTTP ------------------------------------------------------------------------------------

    async def _request(self, data: bytes) -> Exchanged:
        """(status, body) of one exchange; TimeoutError after ``wait + 30`` s."""
        answer = self._start(data)
        try:
            return await answer
        except BaseException:
            self._abandon(answer)
            raise

    def _start(self, data: bytes) -> Answer:
        answer: Answer = self.loop.create_future()
        self._send(data, answer)
        return answer

    def _send(self, data: bytes, sink: _Sink) -> None:
        """Write a request now on a pooled connection (or once a new one is open)."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                conn.send(data, sink, reused=True)
                return
        self.connect_and_send(data, sink)

    def connect_and_send(self, data: bytes, sink: _Sink) -> None:
        task = self.loop.create_task(self._connect_and_send(data, sink))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect_and_send(self, data: bytes, sink: _Sink) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await self.loop.create_connection(lambda: _Connection(self),
                                                            self._host, self._port)
        except asyncio.CancelledError:
            sink.cancel()
            raise
        except Exception as exc:  # refused, timed out: the request's own failure
            if not sink.done():
                sink.set_exception(exc)
            return
        if sink.done():  # given up meanwhile
            conn.close()
            return
        conn.send(data, sink, reused=False)

    def _abandon(self, answer: Answer) -> None:
        """Nobody waits for this answer any more: close its connection, if it is still on one
        (the gateway ends a long poll whose client left)."""
        if not answer.done():
            answer.cancel()
        elif not answer.cancelled():
            answer.exception()  # a failure nobody will read: not "never retrieved"
        for conn in list(self.connections):
            if conn.sink is answer:
                conn.fail(Disconnected("abandoned"))

    def _sweep(self) -> None:
        """Fail the exchanges past their deadline (a timer a request would cost more CPU than
        the rest of its Python), and look again in a second."""
        now = time.monotonic()
        late = [c for c in self.connections if c.sink is not None and c.deadline <= now]
        for conn in late:
            conn.fail(TimeoutError(f"no answer from the gateway within {self.timeout:g} s"))
        self._sweeper = self.loop.call_later(SWEEP_SECONDS, self._sweep)


def expect(record: dict[str, Any], text: str) -> None:
    """The scripted model echoes plain turns and ends tool turns with ``done:``."""
    if record["kind"] != "reply":
        raise TurnFailed(f"{record['kind']}: {record['text']!r}")
    wanted = "done: " if text.startswith("tool:") else f"echo: {text}"
    if not record["text"].startswith(wanted):
        raise TurnFailed(f"expected {wanted!r}, got {record['text']!r}")
