"""A lean HTTP/1.1 client for one origin: the direct model route's POSTs (``openai_http.py``).

aiohttp's client spent ~320 µs of CPU on each model call on the benchmark machine (its request
and response objects, payload registry, URL handling, per-chunk timer rescheduling); this one
spends ~80 µs (``bench/``): one write of bytes prepared once per origin, httptools' C parser
for the answer, a keep-alive pool, one timer a request. It does only what a model call needs:
``POST`` with a byte body, the answer's status, headers and body as it arrives (a JSON
answer or server-sent events), over TCP or TLS. A proxy from the environment still goes
through aiohttp (``openai_http.py``).

What it guards against: a read that stalls (``read_timeout`` between arrivals, not counted
while the reader is behind), a connect that hangs, headers past ``MAX_HEADER_BYTES``, an
answer that is not HTTP, a compressed answer that would inflate without bound (the reader
caps what it takes), a pooled connection the server closed while idle (the request goes
again, once, on a new connection, when not a byte of an answer came back).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

MAX_HEADER_BYTES = 64 * 1024
"""An answer's status line and headers together may be this large; more is refused."""
HIGH_WATER = 512 * 1024
"""Bytes of body held for a reader that is behind before the socket stops being read."""
CHUNK_OUT = 256 * 1024
"""A compressed answer is inflated at most this much at a time."""


class HTTPError(Exception):
    """The exchange failed below HTTP's own statuses."""


class Disconnected(HTTPError, ConnectionError):
    """The server closed the connection before its answer was complete."""


class ReadTimeout(HTTPError, TimeoutError):
    """No byte of the answer arrived for ``read_timeout`` seconds."""


class BadResponse(HTTPError):
    """What came back is not an HTTP/1.1 answer this client reads."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.loop = origin.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.received = 0
        self.complete = False
        self.until_close = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.head: asyncio.Future[None] | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # -- the exchange ------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> asyncio.Future[None]:
        """Write the request: its head, then its body, as they are (``writelines``: the
        body, the largest thing a turn writes, is not copied once more to join them)."""
        assert self.transport is not None
        self._reset()
        self.head = self.loop.create_future()
        self.last = self.loop.time()
        self.timer = self.loop.call_at(self.last + self.origin.read_timeout, self._check_timeout)
        self.transport.writelines((head, body))
        return self.head

    def reusable(self) -> bool:
        return (self.complete and self.keep_alive and self.error is None and not self.closed
                and not self.until_close)

    def finish(self) -> None:
        """The exchange is over (read or abandoned)."""
        self._stop_timer()
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    def take(self) -> bytes | None:
        """The next piece of body held; None when none is."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.last = self.loop.time()
        self.received += len(data)
        if self.head is None or self.complete:  # bytes nobody asked for: the connection
            self.error = self.error or BadResponse("bytes after the answer")  # is not reused
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(self.error or BadResponse(f"the answer is not HTTP/1.1 ({exc})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head is None or self.complete:
            return
        if self.until_close and exc is None and self.head.done():
            self._on_message_complete()  # a body that ends where the connection does
        else:
            self._fail(Disconnected("the server closed the connection"
                                    + (f" ({exc})" if exc else "")))

    def pause_writing(self) -> None:  # the request is written whole; nothing to hold back
        pass

    def resume_writing(self) -> None:  # a large request went out: the wait for the answer
        self.last = self.loop.time()   # starts now, not when it was handed to the socket

    # -- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > MAX_HEADER_BYTES:
            self.error = BadResponse(f"the answer's headers are larger than "
                                     f"{MAX_HEADER_BYTES // 1024} KB")
            raise self.error
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            self.headers, self.header_bytes = {}, 0
            return
        self.until_close = ("content-length" not in self.headers
                            and "chunked" not in self.headers.get("transfer-encoding", ""))
        self.keep_alive = self.parser.should_keep_alive()  # asked now: it resets after the body
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:
            return
        self._on_message_complete()

    def _on_message_complete(self) -> None:
        self.complete = True
        self._stop_timer()
        self._wake()

    # -- inside -------------------------------------------------------------------------------

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self.error = self.error or error
        if self.head is not None and not self.head.done():
            self.head.set_exception(self.error)
            self.head.exception()  # retrieved by the reader; never "never retrieved"
        self._wake()
        self.close()

    def _check_timeout(self) -> None:
        self.timer = None
        if self.complete or self.closed:
            return
        now = self.loop.time()
        # The reader's delay, or a request still being sent: not the server's silence.
        behind = self.paused or bool(self.chunks) or (
            self.transport is not None and self.transport.get_write_buffer_size() > 0)
        due = self.last + self.origin.read_timeout
        if behind or now < due:
            self.timer = self.loop.call_at(max(due, now + 0.05) if behind else due,
                                           self._check_timeout)
            return
        self._fail(ReadTimeout(f"no answer for {self.origin.read_timeout:g}s"))


class Response:
    """An answer being read: ``status``, ``headers`` (lower-case names), ``content_type``
    and the body through ``chunks()``. Leaving its ``async with`` gives the connection back
    to the pool when the body was read whole, else closes it."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers
        kind = conn.headers.get("content-type", "")
        self.content_type = kind.split(";", 1)[0].strip().lower()
        coding = conn.headers.get("content-encoding", "identity").strip().lower()
        self._inflate: Any = None
        if coding in ("gzip", "x-gzip", "deflate"):
            self._inflate = zlib.decompressobj(wbits=47)  # gzip or zlib, told by the header
        elif coding not in ("", "identity"):
            raise BadResponse(f"the answer is encoded as {coding!r}, which this client "
                              "does not read")

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (inflated when the server compressed them)."""
        return _Chunks(self)

    def _inflate_some(self, data: bytes) -> bytes:
        try:
            return self._inflate.decompress(data, CHUNK_OUT)  # type: ignore[no-any-return]
        except zlib.error as exc:
            raise BadResponse(f"the compressed answer is corrupt ({exc})") from exc


class _Chunks:
    """``Response.chunks()``: an iterator of its own rather than an async generator, which
    the event loop tracks in a weak set from its first step to its last (two calls into that
    set's Python code per model call)."""

    __slots__ = ("_resp", "_data", "_done")

    def __init__(self, resp: Response) -> None:
        self._resp = resp
        self._data = b""
        """Compressed bytes not yet inflated (``CHUNK_OUT`` at a time)."""
        self._done = False

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        resp = self._resp
        conn, inflate = resp._conn, resp._inflate
        while True:
            if self._data:
                out = resp._inflate_some(self._data)
                self._data = inflate.unconsumed_tail
                if out:
                    return out  # type: ignore[no-any-return]
                continue
            if self._done:
                raise StopAsyncIteration
            chunk = conn.take()
            if chunk is None:
                if conn.complete:
                    self._done = True
                    tail = inflate.flush() if inflate is not None else b""
                    if tail:
                        return tail  # type: ignore[no-any-return]
                    raise StopAsyncIteration
                if conn.error is not None:
                    raise conn.error
                conn.waiter = conn.loop.create_future()
                await conn.waiter
                conn.waiter = None
                continue
            if inflate is None:
                return chunk
            self._data = chunk


class _Exchange:
    """``async with origin.post(body) as response``."""

    def __init__(self, origin: Origin, body: bytes) -> None:
        self.origin = origin
        self.body = body
        self.conn: _Connection | None = None

    async def __aenter__(self) -> Response:
        self.conn = await self.origin._exchange(self.body)
        try:
            return Response(self.conn)
        except BaseException:
            self.origin._done(self.conn)
            raise

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.conn is not None:
            self.origin._done(self.conn)


class Origin:
    """Keep-alive connections to one ``scheme://host:port`` and the request head for one
    path, prepared once. Created inside the loop that uses it."""

    def __init__(self, url: str, headers: dict[str, str], *, tls: ssl.SSLContext | None,
                 connect_timeout: float, read_timeout: float, limit: int = 100) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{url}: only http:// and https:// are spoken")
        self.host = parts.hostname or ""
        self.tls = tls if parts.scheme == "https" else None
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = self.port == (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {path} HTTP/1.1", f"Host: {host if default else f'{host}:{self.port}'}",
                 "Accept-Encoding: identity", "User-Agent: parley",
                 *(f"{name}: {value}" for name, value in headers.items())]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.loop = asyncio.get_running_loop()
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(limit)
        self.closed = False

    def post(self, body: bytes) -> _Exchange:
        return _Exchange(self, body)

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _exchange(self, body: bytes) -> _Connection:
        if self.closed:
            raise HTTPError("the client is closed")
        head = b"%s%d\r\n\r\n" % (self._head, len(body))
        await self._slots.acquire()
        try:
            while True:
                conn, reused = self._pooled(), True
                if conn is None:
                    conn, reused = await self._connect(), False
                try:
                    await conn.send(head, body)
                    return conn
                except Disconnected:
                    conn.close()
                    # A connection the server dropped while it sat in the pool: the request
                    # never reached it. Anything else (a fresh connection, bytes back) is
                    # the server's answer to this request, and not ours to repeat.
                    if not reused or conn.received:
                        raise
                except BaseException:
                    conn.close()
                    raise
        except BaseException:
            self._slots.release()
            raise

    def _done(self, conn: _Connection) -> None:
        conn.finish()
        if conn.reusable() and not self.closed:
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    def _pooled(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and \
                    not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self) -> _Connection:
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self), self.host, self.port, ssl=self.tls,
                server_hostname=self.host if self.tls is not None else None)
        return conn
