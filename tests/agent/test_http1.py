"""``agent/http1.py`` against a loopback server that writes raw bytes: keep-alive, a pooled
connection the server dropped, chunked, close-delimited and compressed answers, and the
answers it refuses (not HTTP, headers too large, a stall, a cut)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from agent import http1

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]
"""Answers one request (the connection's n-th, from 0); False closes the connection."""


class RawHTTP:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                self.requests.append(head + await reader.readexactly(length))
                if not await self.script(reader, writer, n):
                    break
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[Callable[[Script], Awaitable[RawHTTP]]]:
    started: list[asyncio.Server] = []

    async def start(script: Script) -> RawHTTP:
        raw = RawHTTP(script)
        server = await asyncio.start_server(raw.serve, "127.0.0.1", 0)
        started.append(server)
        raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        return raw

    try:
        yield start
    finally:
        for server in started:
            server.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[RawHTTP]]]:
    async with servers() as start:
        yield start


GZIPPED = gzip.compress(b"hello world")


def origin(raw: RawHTTP, read_timeout: float = 10.0, limit: int = 100) -> http1.Origin:
    return http1.Origin(raw.url, {"Authorization": "Bearer k"}, tls=None, connect_timeout=10,
                        read_timeout=read_timeout, limit=limit)


async def body_of(client: http1.Origin, data: bytes = b"{}") -> tuple[int, bytes]:
    async with client.post(data) as resp:
        return resp.status, b"".join([c async for c in resp.chunks()])


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "\r\n".join([f"HTTP/1.1 {status}", *headers, ""])
    return head.encode() + b"\r\n" + body


def plain(body: bytes) -> bytes:
    return answer(body, "Content-Type: application/json", f"Content-Length: {len(body)}")


def writes(wire: bytes) -> Script:
    """A server that answers every request with ``wire``."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        writer.write(wire)
        return True
    return script


async def test_one_connection_carries_request_after_request(serve: Callable[..., Awaitable[RawHTTP]]
                                                            ) -> None:
    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(plain(b'{"n": %d}' % n))
        return True

    raw = await serve(ok)
    client = origin(raw)
    assert [await body_of(client, b'{"q": %d}' % i) for i in range(3)] == [
        (200, b'{"n": 0}'), (200, b'{"n": 1}'), (200, b'{"n": 2}')]
    assert raw.connections == 1
    first = raw.requests[0].decode()
    assert first.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: {raw.url.split('/')[2]}\r\n" in first and "Authorization: Bearer k" in first
    assert "Accept-Encoding: identity" in first and first.endswith('{"q": 0}')
    await client.aclose()


async def test_a_pooled_connection_the_server_dropped_is_replaced_once(
        serve: Callable[..., Awaitable[RawHTTP]]) -> None:
    """The server reads the second request on the kept connection and closes it without a
    byte back (what an idle timeout racing the request looks like): the request goes again on
    a new connection. A new connection closed the same way is the server's answer."""
    async def drops_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           n: int) -> bool:
        if n == 1:
            return False
        writer.write(plain(b'"ok"'))
        return True

    raw = await serve(drops_second)
    client = origin(raw)
    assert await body_of(client) == (200, b'"ok"')
    assert await body_of(client) == (200, b'"ok"')
    assert raw.connections == 2 and len(raw.requests) == 3
    await client.aclose()

    async def drops_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        n: int) -> bool:
        return False

    client = origin(await serve(drops_all))
    with pytest.raises(http1.Disconnected):
        await body_of(client)
    await client.aclose()


WIRES = [
    answer(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "Transfer-Encoding: chunked"),
    answer(GZIPPED, "Content-Encoding: gzip", f"Content-Length: {len(GZIPPED)}"),
    plain(b"hello world"),
]


@pytest.mark.parametrize("wire", WIRES, ids=["chunked", "gzip", "length"])
async def test_chunked_and_compressed_answers(serve: Callable[..., Awaitable[RawHTTP]],
                                              wire: bytes) -> None:
    client = origin(await serve(writes(wire)))
    assert await body_of(client) == (200, b"hello world")
    await client.aclose()


async def test_a_compressed_answer_is_inflated_a_piece_at_a_time(
        serve: Callable[..., Awaitable[RawHTTP]]) -> None:
    """A small compressed answer that inflates to much more comes out in pieces of at most
    ``CHUNK_OUT`` bytes (what ``openai_http._read`` counts against its limit), whole, and
    the request the server received is its head and its body as written."""
    big = b"parley " * (3 * http1.CHUNK_OUT // 7 + 5)
    packed = gzip.compress(big)
    raw = await serve(writes(answer(packed, "Content-Encoding: gzip",
                                    f"Content-Length: {len(packed)}")))
    client = origin(raw)
    async with client.post(b'{"a": 1}') as resp:
        pieces = [c async for c in resp.chunks()]
    assert len(packed) < http1.CHUNK_OUT < len(big)
    assert b"".join(pieces) == big
    assert len(pieces) >= 3 and all(len(p) <= http1.CHUNK_OUT for p in pieces)
    assert raw.requests[0].endswith(b'Content-Length: 8\r\n\r\n{"a": 1}')
    await client.aclose()


async def test_an_interim_answer_and_a_body_that_ends_with_the_connection(
        serve: Callable[..., Awaitable[RawHTTP]]) -> None:
    async def old_style(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        n: int) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(answer(b"until the end", "Content-Type: text/plain"))
        await writer.drain()
        return False  # no length, not chunked: the body ends where the connection does

    raw = await serve(old_style)
    client = origin(raw)
    assert await body_of(client) == (200, b"until the end")
    assert await body_of(client) == (200, b"until the end")
    assert raw.connections == 2  # such a connection is never reused
    await client.aclose()


async def test_a_large_answer_read_slowly_arrives_whole(
        serve: Callable[..., Awaitable[RawHTTP]]) -> None:
    big = bytes(range(256)) * (4 * 4096)  # 4 MB: reading stops and starts again

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(plain(big))
        await writer.drain()
        return True

    client = origin(await serve(large))
    async with client.post(b"{}") as resp:
        got = bytearray()
        async for chunk in resp.chunks():
            got += chunk
            for _ in range(3):  # a reader slower than the socket
                await asyncio.sleep(0)
    assert bytes(got) == big
    assert await body_of(client) == (200, big)
    await client.aclose()


@pytest.mark.parametrize(("wire", "why"), [
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP"),
    (b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n",
     "headers are larger than 64 KB"),
    (answer(b"xx", "Content-Encoding: br", "Content-Length: 2"), "'br'"),
], ids=["not-http", "huge-headers", "brotli"])
async def test_what_is_refused(serve: Callable[..., Awaitable[RawHTTP]], wire: bytes,
                               why: str) -> None:
    client = origin(await serve(writes(wire)))
    with pytest.raises(http1.BadResponse, match=why):
        await body_of(client)
    await client.aclose()


async def test_a_cut_answer_and_a_silent_server(serve: Callable[..., Awaitable[RawHTTP]]
                                                ) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(answer(b"only part", "Content-Length: 100"))
        await writer.drain()
        return False

    client = origin(await serve(cut))
    with pytest.raises(http1.Disconnected):
        await body_of(client)
    await client.aclose()

    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        await release.wait()
        return False

    raw = await serve(silent)
    client = origin(raw, read_timeout=0.05, limit=1)
    with pytest.raises(http1.ReadTimeout):
        await body_of(client)
    # The timed-out request gave its slot back: the next one is sent (and times out too).
    with pytest.raises(TimeoutError):
        await body_of(client)
    assert len(raw.requests) == 2
    release.set()
    await client.aclose()


async def test_a_cancelled_request_closes_its_connection_and_frees_its_slot(
        serve: Callable[..., Awaitable[RawHTTP]]) -> None:
    arrived = asyncio.Event()

    async def first_hangs(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          n: int) -> bool:
        if len(raw.requests) == 1:
            arrived.set()
            await reader.read()  # until the client closes
            return False
        writer.write(plain(b'"second"'))
        return True

    raw = await serve(first_hangs)
    client = origin(raw, limit=1)
    task = asyncio.create_task(body_of(client))
    await arrived.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await body_of(client) == (200, b'"second"')
    assert raw.connections == 2
    await client.aclose()


def test_all_of_it_on_uvloop() -> None:
    """The gateway runs on uvloop, whose transports are not ``asyncio.Transport``
    subclasses and whose pause/resume and close differ in timing: the same tests there."""
    async def every_test() -> None:
        async with servers() as start:
            for test in (test_one_connection_carries_request_after_request,
                         test_a_pooled_connection_the_server_dropped_is_replaced_once,
                         test_an_interim_answer_and_a_body_that_ends_with_the_connection,
                         test_a_large_answer_read_slowly_arrives_whole,
                         test_a_cut_answer_and_a_silent_server,
                         test_a_cancelled_request_closes_its_connection_and_frees_its_slot):
                await test(start)
            for wire in WIRES:
                await test_chunked_and_compressed_answers(start, wire)
            await test_what_is_refused(start, b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP")

    uvloop.run(every_test())
