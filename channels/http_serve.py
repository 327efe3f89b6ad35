"""A lean HTTP/1.1 server for a small JSON API: the local channel's (``channels/local.py``).

aiohttp's server spent ~18 % of the gateway's CPU at 100 chats on the local channel's two
requests a turn (its request, response and writer objects, the router, middlewares and header
multidicts; ``bench/``). This one parses with httptools (llhttp, in C), hands the caller a
``Request`` whose body is already read, and writes the ``Reply`` as one byte string. It does
what a JSON API on loopback needs and no more: keep-alive and pipelining (answered in order),
``Content-Length`` and chunked bodies, ``Expect: 100-continue``, ``HEAD``.

What it guards against, before the caller sees anything: a head past ``MAX_HEAD_BYTES`` (431),
a body past ``Limits.max_body`` (413, by its announced length before a byte of it is read), a
request not received in full within ``Limits.within`` seconds of its first byte (408: a stalled
or trickling client holds no connection for long), bytes that are not HTTP (400), a request
the caller refuses from its head alone (``admit``: an unknown route, a missing token: the body
is never read). Each of these answers closes the connection. A client that pipelines without
reading its answers is read no further until it does; a connection idle for
``KEEPALIVE_SECONDS`` is closed.
A client that goes away mid-request is a debug line; a safe request (``GET``, ``HEAD``) whose
client went away is cancelled, any other runs to its end (a message may be stored: the client
retries with its ``message_id``). A client that half-closes its side (sends its end of stream)
counts as gone: a long poll whose client left must not wait out its 60 s, and HTTP/1.1
clients do not half-close while they wait for an answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import httptools

from channels.http_api import parse_query
from gateway.kernel.frozen import frozen

MAX_HEAD_BYTES = 64 * 1024
"""The request line and headers together may be this large; more is refused (431)."""
MAX_PIPELINED = 8
"""Requests read ahead on one connection before reading stops until answers are written."""
KEEPALIVE_SECONDS = 75.0
"""An idle keep-alive connection is closed after this long (aiohttp's default too)."""
JSON = "application/json; charset=utf-8"
SAFE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(slots=True)
class Request:
    """One request: ``headers`` by lower-cased name (the first of repeated ones), the
    ``query``'s first value per name, ``body`` read in full."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


@frozen
class Limits:
    max_body: int
    """Bytes a request body may have."""
    within: float
    """Seconds from a request's first byte to its last."""
    within_key: str
    """The setting ``within`` comes from, named in the 408's message."""


Handler = Callable[[Request], Awaitable[Reply]]
Admit = Callable[[Request], "Reply | None"]
Refuse = Callable[[int, str, tuple[tuple[str, str], ...]], Reply]


class _Refused(Exception):
    """Raised inside a parser callback: answer ``reply`` and close the connection."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply


_REASONS = {s.value: s.phrase for s in HTTPStatus}
_date_cache: list[Any] = [0, b""]


def _date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True).encode()
    return _date_cache[1]  # type: ignore[no-any-return]


def encode(reply: Reply, *, keep_alive: bool, head_only: bool = False) -> bytes:
    """The whole answer as bytes: status line, headers, body (none for ``HEAD``)."""
    body = reply.body
    lines = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n" % (
        reply.status, _REASONS.get(reply.status, "Unknown").encode(),
        reply.content_type.encode(), len(body), _date())]
    for name, value in reply.headers:
        lines.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
    lines.append(b"\r\n" if keep_alive else b"Connection: close\r\n\r\n")
    if not head_only:
        lines.append(body)
    return b"".join(lines)


@dataclass(slots=True)
class _Pending:
    request: Request
    keep_alive: bool


@dataclass(slots=True)
class _Partial:
    """The request being read: its head's parts, then its body's."""

    url: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    head_bytes: int = 0
    request: Request | None = None
    body: list[bytes] = field(default_factory=list)
    body_bytes: int = 0
    started: float = 0.0


class _Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.partial: _Partial | None = None
        self.queue: deque[_Pending] = deque()
        self.task: asyncio.Task[None] | None = None
        self.serving: _Pending | None = None
        self.closing = False
        self.paused = False
        self.write_paused = False
        self.writable: asyncio.Future[None] | None = None
        self.last_active = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None

    # --- the transport's side ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        self._arm(self.last_active + KEEPALIVE_SECONDS)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        partial = self.partial
        if partial is not None and partial.request is not None:
            self.server.log.debug("%s: the client of %s %s disconnected", self.server.what,
                                  partial.request.method, partial.request.path)
        self.partial = None
        self.queue.clear()
        if (self.task is not None and self.serving is not None
                and self.serving.request.method in SAFE_METHODS):
            self.task.cancel()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_active = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.reply)
            else:  # a bug of ours in a callback: not the client's fault, still answered
                self.server.log.error("%s: reading a request failed", self.server.what,
                                      exc_info=refused or exc)
                self._refuse(self.server.refuse(500, "internal error", ()))
            return
        except httptools.HttpParserUpgrade:
            # the request asked to switch protocols: it is answered (when whole) in HTTP/1.1,
            # and the connection closes after it (what follows is not HTTP/1.1)
            self.closing = True
            if self.partial is not None:
                self._refuse(self.server.refuse(400, "request: protocol upgrades are not "
                                                     "supported", ()))
                return
            if self.queue and self.transport is not None:
                self.queue[-1].keep_alive = False
                self.transport.pause_reading()
        except httptools.HttpParserError as exc:
            self._refuse(self.server.refuse(400, f"request: not valid HTTP/1.1 ({exc})", ()))
            return
        partial = self.partial
        if partial is not None:  # a request left half-read: ``within`` seconds from its start
            deadline = partial.started + self.server.limits.within
            if self.timer is None or self.timer.when() > deadline:
                if self.timer is not None:
                    self.timer.cancel()
                self._arm(deadline)
        if self.queue and self.task is None:
            self._next()

    # --- the parser's callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.partial = _Partial(started=self.loop.time())

    def on_url(self, url: bytes) -> None:
        partial = self.partial
        assert partial is not None
        partial.url.append(url)
        partial.head_bytes += len(url)
        if partial.head_bytes > MAX_HEAD_BYTES:
            raise _Refused(self.server.refuse(431, f"request: head larger than "
                                                   f"{MAX_HEAD_BYTES} bytes", ()))

    def on_header(self, name: bytes, value: bytes) -> None:
        partial = self.partial
        assert partial is not None
        partial.head_bytes += len(name) + len(value) + 4
        if partial.head_bytes > MAX_HEAD_BYTES:
            raise _Refused(self.server.refuse(431, f"request: head larger than "
                                                   f"{MAX_HEAD_BYTES} bytes", ()))
        key = name.decode("latin-1").lower()
        if key not in partial.headers:
            partial.headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        partial = self.partial
        assert partial is not None
        server = self.server
        url = httptools.parse_url(b"".join(partial.url))
        try:
            path = (url.path or b"/").decode()
            query = {} if not url.query else parse_query(url.query.decode())
        except UnicodeDecodeError:
            raise _Refused(server.refuse(400, "request: the address is not valid UTF-8",
                                         ())) from None
        request = partial.request = Request(self.parser.get_method().decode(), path, query,
                                            partial.headers)
        refused = server.admit(request)
        if refused is not None:
            raise _Refused(refused)
        length = partial.headers.get("content-length")
        if length is not None and int(length) > server.limits.max_body:
            raise _Refused(server.refuse(413, f"body: larger than {server.limits.max_body} "
                                              "bytes", ()))
        if partial.headers.get("expect", "").lower() == "100-continue":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        partial = self.partial
        assert partial is not None
        partial.body_bytes += len(body)
        if partial.body_bytes > self.server.limits.max_body:
            raise _Refused(self.server.refuse(
                413, f"body: larger than {self.server.limits.max_body} bytes", ()))
        partial.body.append(body)

    def on_message_complete(self) -> None:
        partial, self.partial = self.partial, None
        assert partial is not None and partial.request is not None
        request = partial.request
        if partial.body:
            request.body = partial.body[0] if len(partial.body) == 1 else b"".join(partial.body)
        self.queue.append(_Pending(request, self.parser.should_keep_alive()))
        if len(self.queue) >= MAX_PIPELINED and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    # --- answering ----------------------------------------------------------------------------

    def _next(self) -> None:
        pending = self.serving = self.queue.popleft()
        self.task = self.loop.create_task(self._serve(pending))

    async def _serve(self, pending: _Pending) -> None:
        server = self.server
        request = pending.request
        try:
            reply = await server.handle(request)
        except asyncio.CancelledError:
            self.task = self.serving = None
            if not self.closing:
                raise
            return  # the client went away, or the server stops: nobody to answer
        except Exception:
            server.log.exception("%s: %s %s failed", server.what, request.method, request.path)
            reply = server.refuse(500, "internal error", ())
        self.serving = None
        transport = self.transport
        if self.closing or transport is None or transport.is_closing():
            self.task = None
            return
        keep_alive = pending.keep_alive and not server.stopping
        transport.write(encode(reply, keep_alive=keep_alive,
                               head_only=request.method == "HEAD"))
        if not keep_alive:
            self.task = None
            self.closing = True
            transport.close()
            return
        self.last_active = self.loop.time()
        if self.write_paused:  # the client reads slowly: no further answer before it catches up
            self.writable = self.loop.create_future()
            await self.writable
            self.writable = None
        self.task = None
        if self.closing:
            return
        if self.paused and len(self.queue) < MAX_PIPELINED // 2:
            self.paused = False
            transport.resume_reading()
        if self.queue:
            self._next()
        elif self.timer is None:
            self._arm(self._idle_deadline())

    def _refuse(self, reply: Reply) -> None:
        """Answer ``reply`` now and close: what follows on this connection is not read."""
        self.closing = True
        self.partial = None
        self.queue.clear()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(encode(reply, keep_alive=False))
            transport.close()

    # --- the one timer: idle keep-alive, or a request's deadline -------------------------------

    def _idle_deadline(self) -> float:
        return self.last_active + KEEPALIVE_SECONDS

    def _arm(self, when: float) -> None:
        self.timer = self.loop.call_at(when, self._timed_out)

    def _timed_out(self) -> None:
        self.timer = None
        if self.closing or self.transport is None:
            return
        now = self.loop.time()
        partial = self.partial
        if partial is not None:
            deadline = partial.started + self.server.limits.within
            if now < deadline:
                self._arm(deadline)
                return
            limits = self.server.limits
            what = "body" if partial.request is not None else "request"
            self._refuse(self.server.refuse(
                408, f"{what}: not received in full within {limits.within:g} s "
                     f"({limits.within_key})", ()))
            return
        if self.task is not None or self.queue:
            return  # busy: the idle timer is set again once it is not
        deadline = self._idle_deadline()
        if now < deadline:
            self._arm(deadline)
        else:
            self.closing = True
            self.transport.close()

    def close_if_idle(self) -> bool:
        """(Stopping.) Close now when nothing is being read or answered."""
        if self.task is None and not self.queue:  # a half-read request is dropped
            self.closing = True
            if self.transport is not None:
                self.transport.close()
            return True
        return False

    def abort(self) -> None:
        self.closing = True
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None:
            self.transport.abort()


class Server:
    """``handle`` answers a whole request; ``admit`` may refuse one from its head (route,
    method, token) before its body is read; ``refuse(status, message, headers)`` shapes the
    server's own refusals (the caller's JSON error body). ``what`` prefixes log lines."""

    def __init__(self, handle: Handler, *, admit: Admit, refuse: Refuse, limits: Limits,
                 log: logging.Logger, what: str) -> None:
        self.handle = handle
        self.admit = admit
        self.refuse = refuse
        self.limits = limits
        self.log = log
        self.what = what
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self.stopping = False
        self._server: asyncio.base_events.Server | None = None

    async def listen(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0: a free port); the port bound. ``OSError`` when the
        address cannot be had."""
        self._server = await self.loop.create_server(lambda: _Connection(self), host, port,
                                                     reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, timeout: float) -> None:  # noqa: ASYNC109
        """Stop listening, close idle connections, let requests being answered finish for up
        to ``timeout`` seconds (their answers close their connections), then cut the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        loop = self.loop
        deadline = loop.time() + timeout
        while True:
            busy = [c for c in list(self.connections) if not c.close_if_idle()]
            tasks = [c.task for c in busy if c.task is not None]
            if not tasks or loop.time() >= deadline:
                break
            await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
