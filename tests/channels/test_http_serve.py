"""``channels/http_serve.py`` from a raw socket: keep-alive and pipelining in order, ``HEAD``,
``Expect: 100-continue``, what it refuses before the caller sees a request (a head too large, a
body too large, bytes that are not HTTP, what ``admit`` turns away), a request that never
arrives in full, a client that goes away, a failing handler, stopping, and an idle connection;
all of it on asyncio's loop and on uvloop's (the gateway's)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qsl

import orjson
import pytest
import uvloop

from channels import http_serve
from channels.http_api import parse_query
from channels.http_serve import Limits, Reply, Request, Server
from tests.e2e.waiting import until

_log = logging.getLogger("tests.http_serve")


class App:
    """Echoes what it was asked; ``/slow`` waits for ``release``; ``/boom`` raises."""

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.ended: list[str] = []

    def admit(self, request: Request) -> Reply | None:
        if request.path == "/private":
            return refuse(401, "authorization: missing", ())
        return None

    async def handle(self, request: Request) -> Reply:
        self.seen.append(request)
        try:
            if request.path == "/slow":
                self.started.set()
                await self.release.wait()
            if request.path == "/boom":
                raise RuntimeError("handler exploded")
            return Reply(200, orjson.dumps({"method": request.method, "path": request.path,
                                            "query": request.query,
                                            "body": request.body.decode()}))
        finally:
            self.ended.append(request.path)


def refuse(status: int, message: str, headers: tuple[tuple[str, str], ...]) -> Reply:
    return Reply(status, orjson.dumps({"error": message}), headers=headers)


@contextlib.asynccontextmanager
async def serving(within: float = 10.0, max_body: int = 1000) -> AsyncIterator[tuple[App, Server,
                                                                                     int]]:
    app = App()
    server = Server(app.handle, admit=app.admit, refuse=refuse, log=_log, what="test api",
                    limits=Limits(max_body, within, "test.body_timeout"))
    port = await server.listen("127.0.0.1", 0)
    try:
        yield app, server, port
    finally:
        app.release.set()
        await server.stop(5.0)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:]
                                                   if line)}
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 10) if length else b""
    return status, headers, body


def get(path: str, *extra: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *extra, "", ""]).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}",
                        *extra, "", ""]).encode() + body


Connect = Callable[[int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 10) == b""


async def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async with serving() as (app, _, port):
        reader, writer = await connect(port)
        writer.write(get("/a?x=1&x=2&y=%C3%A9+z"))
        status, headers, body = await read_answer(reader)
        assert status == 200 and headers["content-type"] == "application/json; charset=utf-8"
        assert orjson.loads(body) == {"method": "GET", "path": "/a", "body": "",
                                      "query": {"x": "1", "y": "é z"}}
        assert "connection" not in headers and "date" in headers
        # three at once, the first held back: the answers still come in the order asked
        writer.write(get("/slow") + post("/b", b"hello") + get("/c"))
        await asyncio.wait_for(app.started.wait(), 10)
        app.release.set()
        paths = [orjson.loads((await read_answer(reader))[2])["path"] for _ in range(3)]
        assert paths == ["/slow", "/b", "/c"]
        assert app.seen[2].body == b"hello"
        writer.write(get("/d", "Connection: close"))
        status, headers, _ = await read_answer(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await closed_by_server(reader)
        writer.close()


async def test_head_chunked_and_expect_continue() -> None:
    async with serving() as (_, _, port):
        reader, writer = await connect(port)
        writer.write(get("/a").replace(b"GET", b"HEAD", 1))
        status, headers, body = await read_answer_head_only(reader)
        assert status == 200 and int(headers["content-length"]) > 0 and body == b""
        writer.write(b"POST /chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        assert orjson.loads((await read_answer(reader))[2])["body"] == "hello world"
        writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"data")
        assert orjson.loads((await read_answer(reader))[2])["body"] == "data"
        writer.close()


async def read_answer_head_only(reader: asyncio.StreamReader
                                ) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:]
                                                   if line)}
    # a HEAD answer has no body: the next bytes on the connection are the next answer's
    return int(lines[0].split()[1]), headers, b""


@pytest.mark.parametrize(("wire", "status", "error"), [
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431, "request: head larger"),
    (get("/a", *(f"X-Filler-{i}: {'v' * 1000}" for i in range(70))), 431,
     "request: head larger"),
    (post("/a", b"x" * 1001), 413, "body: larger than 1000 bytes"),
    (b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"3e8\r\n" + b"x" * 1000 + b"\r\n" + b"1\r\nx\r\n", 413, "body: larger than 1000 bytes"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", 400, "request: not valid HTTP/1.1"),
    (b"GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", 400,
     "request: not valid HTTP/1.1"),
    (get("/a?chat_id=%FF%FE"), 400, "request: the address is not valid UTF-8"),
    (post("/private", b"x" * 500), 401, "authorization: missing"),
])
async def test_what_is_refused_before_the_handler(wire: bytes, status: int, error: str) -> None:
    async with serving() as (app, _, port):
        reader, writer = await connect(port)
        writer.write(wire)
        got, headers, body = await read_answer(reader)
        assert got == status and headers["connection"] == "close"
        assert orjson.loads(body)["error"].startswith(error)
        assert await closed_by_server(reader)
        assert app.seen == []
        writer.close()


async def test_a_request_that_never_arrives_in_full_is_408() -> None:
    """The server's timer decides (``within`` from the request's first byte), not the
    test's: the head alone, then a body cut short."""
    async with serving(within=0.05) as (app, _, port):
        for wire, what in ((b"GET /a HTTP/1.1\r\nHost: x\r\n", "request"),
                           (b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab",
                            "body")):
            reader, writer = await connect(port)
            writer.write(wire)
            status, _, body = await read_answer(reader)
            assert status == 408
            assert orjson.loads(body)["error"] == (
                f"{what}: not received in full within 0.05 s (test.body_timeout)")
            assert await closed_by_server(reader)
            writer.close()
        assert app.seen == []


async def test_a_client_that_goes_away(caplog: pytest.LogCaptureFixture) -> None:
    """Mid-body: a debug line and no request. Mid-answer: a GET is cancelled, a POST runs to
    its end (what it stored stays stored), and nothing is written."""
    caplog.set_level(logging.DEBUG, logger="tests.http_serve")
    async with serving() as (app, server, port):
        _, writer = await connect(port)
        writer.write(b"POST /half HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        for method, wire in (("GET", get("/slow")), ("POST", post("/slow", b"{}"))):
            app.started.clear()
            _, writer = await connect(port)
            writer.write(wire)
            await asyncio.wait_for(app.started.wait(), 10)
            writer.close()
            await writer.wait_closed()
            await until(lambda: not server.connections, "the server to see the client go")
            if method == "GET":
                await until(lambda: len(app.ended) == 1, "the GET cancelled")  # not released
            else:
                assert app.ended == ["/slow"]  # still running
                app.release.set()
                await until(lambda: len(app.ended) == 2, "the POST to end")
        said = [r.getMessage() for r in caplog.records]
        assert "test api: the client of POST /half disconnected" in said
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.path for r in app.seen] == ["/slow", "/slow"]


async def test_a_failing_handler_is_500_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async with serving() as (_, _, port):
        reader, writer = await connect(port)
        writer.write(get("/boom") + get("/after"))
        status, _, body = await read_answer(reader)
        assert status == 500 and orjson.loads(body) == {"error": "internal error"}
        assert (await read_answer(reader))[0] == 200  # the connection goes on
        writer.close()
    assert any("handler exploded" in (r.exc_text or "") for r in caplog.records)


async def test_stopping_answers_what_is_in_flight_and_closes_the_rest() -> None:
    async with serving() as (app, server, port):
        idle_reader, idle_writer = await connect(port)
        idle_writer.write(get("/a"))
        await read_answer(idle_reader)
        reader, writer = await connect(port)
        writer.write(get("/slow"))
        await asyncio.wait_for(app.started.wait(), 10)
        stopping = asyncio.create_task(server.stop(10.0))
        assert await closed_by_server(idle_reader)
        app.release.set()
        status, headers, _ = await read_answer(reader)
        assert status == 200 and headers["connection"] == "close"
        await stopping
        with pytest.raises(OSError):
            await connect(port)
        writer.close()
        idle_writer.close()


async def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_serve, "KEEPALIVE_SECONDS", 0.05)
    async with serving() as (_, _, port):
        reader, writer = await connect(port)
        writer.write(get("/a"))
        await read_answer(reader)
        assert await closed_by_server(reader)  # the server's timer, not the test's
        writer.close()


def test_all_of_it_on_uvloop() -> None:
    """The gateway runs on uvloop (its transports differ in pause, resume and close)."""
    async def every_test() -> None:
        await test_keep_alive_and_pipelined_requests_are_answered_in_order()
        await test_head_chunked_and_expect_continue()
        await test_a_request_that_never_arrives_in_full_is_408()
        await test_stopping_answers_what_is_in_flight_and_closes_the_rest()
        for wire, status, error in (
                (post("/a", b"x" * 1001), 413, "body: larger"),
                (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", 400, "request: not valid")):
            await test_what_is_refused_before_the_handler(wire, status, error)

    uvloop.run(every_test())


def test_a_query_reads_as_parse_qsl_reads_it_first_field_kept() -> None:
    rng = random.Random(24)
    alphabet = ["a", "b", "=", "&", "%", "+", "é", "20", "%C3%A9", "%zz", ";", " ", "0"]
    for _ in range(5_000):
        query = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        try:
            expected: dict[str, str] | Exception = dict(reversed(parse_qsl(
                query, keep_blank_values=True, errors="strict")))
        except UnicodeDecodeError as exc:
            expected = exc
        if isinstance(expected, Exception):
            with pytest.raises(UnicodeDecodeError):
                parse_query(query)
        else:
            assert parse_query(query) == expected, query
