"""The local channel, driven over real HTTP with a real bus: what a POST may carry, the
token and listen address, health and errors. Replies and long polls are in
``test_local_replies.py``."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.base import Channel
from channels.local import (
    LocalChannel,
    LocalChannelError,
    is_loopback,
)
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import LocalChannelConfig
from gateway.kernel.events import InboundMessage, OutboundMessage
from tests.channels.conftest import make_channel
from tests.e2e.waiting import until

TOKEN = "s3cret-token-value"


async def next_inbound(bus: MessageBus) -> InboundMessage:
    return await asyncio.wait_for(bus.consume_inbound(), 5)


def reply(chat_id: str, text: str, **kw: Any) -> OutboundMessage:
    return OutboundMessage(channel="local", chat_id=chat_id, text=text, **kw)


async def test_is_a_channel(channel: LocalChannel) -> None:
    assert isinstance(channel, Channel)
    assert channel.name == "local"
    assert channel.status().running


async def test_post_publishes_inbound_message(http: aiohttp.ClientSession,
                                              bus: MessageBus) -> None:
    body = {"chat_id": "c1", "sender_id": "u7", "text": "hello", "sender_name": "Ann",
            "chat_type": "group", "mentioned": True, "thread_id": None}
    async with http.post("/v1/messages", json=body) as resp:
        assert resp.status == 202
        data = await resp.json()
    msg = await next_inbound(bus)
    assert data == {"message_id": msg.message_id}
    assert (msg.channel, msg.chat_id, msg.sender_id, msg.text) == ("local", "c1", "u7", "hello")
    assert msg.session_key == "local:c1"
    assert (msg.chat_type, msg.mentioned, msg.sender_name, msg.kind) == (
        "group", True, "Ann", "user")


async def test_post_thread_and_command(http: aiohttp.ClientSession, bus: MessageBus) -> None:
    body = {"chat_id": "c1", "sender_id": "u1", "text": "/new", "thread_id": "t9"}
    async with http.post("/v1/messages", json=body) as resp:
        assert resp.status == 202
    msg = await next_inbound(bus)
    assert msg.thread_id == "t9" and msg.session_key == "local:c1:t9"
    assert msg.kind == "command"


async def test_local_senders_are_the_owner_unless_lowered(http: aiohttp.ClientSession,
                                                          bus: MessageBus) -> None:
    for extra, trust in (({}, "owner"), ({"trust": "guest"}, "guest"),
                         ({"trust": "member"}, "member")):
        body = {"chat_id": "c1", "sender_id": "u1", "text": "hi", **extra}
        async with http.post("/v1/messages", json=body) as resp:
            assert resp.status == 202
        assert (await next_inbound(bus)).trust == trust


GOOD = {"chat_id": "c1", "sender_id": "u1", "text": "hi"}


@pytest.mark.parametrize(("body", "field"), [
    ({"sender_id": "u1", "text": "hi"}, "chat_id:"),
    ({**GOOD, "sender_id": ""}, "sender_id:"),
    ({**GOOD, "chat_id": "x" * 257}, "chat_id:"),
    ({**GOOD, "text": 5}, "text:"),
    ({**GOOD, "text": ""}, "text:"),
    ({**GOOD, "text": "a\x00b"}, "text:"),
    ({**GOOD, "foo": 1}, "foo: unknown field"),
    ({**GOOD, "chat_type": "channel"}, "chat_type:"),
    ({**GOOD, "trust": "admin"}, "trust:"),
    ({**GOOD, "mentioned": "yes"}, "mentioned:"),
    ({**GOOD, "thread_id": 3}, "thread_id:"),
    ({**GOOD, "sender_name": ["x"]}, "sender_name:"),
    (b"{not json", "body:"),
    (b"", "body:"),
    (b"[1, 2]", "body:"),
    ({**GOOD, "media": {"path": "/x"}}, "media:"),
    ({**GOOD, "media": [{"path": "/x"}] * 11}, "media:"),
    ({**GOOD, "media": [{"data_base64": "!!!!", "mime": "image/png", "name": "a.png"}]},
     "media[0].data_base64: not valid base64"),
    ({**GOOD, "media": [{"data_base64": "aGk=", "mime": "nonsense"}]}, "media[0].mime:"),
    ({**GOOD, "media": [{"data_base64": "aGk=", "mime": "text/plain", "x": 1}]},
     "media[0].x: unknown field"),
    ({**GOOD, "media": [{"path": "/definitely/not/here.png"}]}, "media[0].path:"),
    ({**GOOD, "media": [{"path": "/tmp", "data_base64": "aGk="}]}, "media[0]:"),
])
async def test_bad_body_is_400_naming_the_field(http: aiohttp.ClientSession, bus: MessageBus,
                                                body: Any, field: str) -> None:
    kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with http.post("/v1/messages", **kw) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error.startswith(field), error
    assert bus.inbound_size == 0


async def test_oversize_text_is_413_naming_text(http: aiohttp.ClientSession) -> None:
    async with http.post("/v1/messages", json={**GOOD, "text": "x" * 1001}) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"] == "text: longer than 1000 characters"


@pytest.mark.parametrize("chunked", [False, True])
async def test_oversize_body_is_413_json(http: aiohttp.ClientSession, chunked: bool) -> None:
    blob = b'{"chat_id": "' + b"x" * 300_000 + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(blob), 16_384):
            yield blob[start:start + 16_384]

    async with http.post("/v1/messages", data=chunks() if chunked else blob) as resp:
        assert resp.status == 413
        assert resp.content_type == "application/json"
        assert (await resp.json())["error"].startswith("body: larger than ")


async def test_oversize_base64_media_is_refused_naming_it(http: aiohttp.ClientSession) -> None:
    media = [{"data_base64": base64.b64encode(b"x" * 1025).decode(), "mime": "image/png"}]
    async with http.post("/v1/messages", json={**GOOD, "media": media}) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"].startswith("media[0].data_base64: larger than")


async def test_base64_media_is_saved_in_the_chat_inbox(http: aiohttp.ClientSession,
                                                     bus: MessageBus, tmp_path: Path) -> None:
    payload = b"\x89PNG fake image bytes"
    media = [{"data_base64": base64.b64encode(payload).decode(), "mime": "image/png",
              "name": "../../../etc/evil.PNG"}]
    async with http.post("/v1/messages", json={**GOOD, "text": "", "media": media}) as resp:
        assert resp.status == 202
    msg = await next_inbound(bus)
    (item,) = msg.media
    assert (item.kind, item.mime, item.size) == ("image", "image/png", len(payload))
    saved = Path(item.path or "")
    assert saved.parent == tmp_path / "inbox" / "local" / msg.chat_id
    assert saved.suffix == ".png" and "evil" not in saved.name
    assert await asyncio.to_thread(saved.read_bytes) == payload


async def test_path_media_takes_kind_and_size_from_the_file(http: aiohttp.ClientSession,
                                                            bus: MessageBus,
                                                            tmp_path: Path) -> None:
    song = tmp_path / "song.mp3"
    song.write_bytes(b"a" * 100)
    big = tmp_path / "big.bin"
    big.write_bytes(b"a" * 1025)
    async with http.post("/v1/messages", json={**GOOD, "media": [{"path": str(big)}]}) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"].startswith("media[0].path: larger than")
    async with http.post("/v1/messages", json={**GOOD, "media": [{"path": str(song)}]}) as resp:
        assert resp.status == 202
    msg = await next_inbound(bus)
    (item,) = msg.media
    copy = tmp_path / "inbox" / "local" / msg.chat_id / "song.mp3"  # copied into the inbox
    assert (item.kind, item.path, item.size) == ("audio", str(copy), 100)
    assert copy.read_bytes() == song.read_bytes()
    assert not list(tmp_path.glob("inbox/local/*/big*"))  # refused: nothing copied


async def test_closed_bus_is_503(http: aiohttp.ClientSession, bus: MessageBus) -> None:
    bus.close()
    async with http.post("/v1/messages", json=GOOD) as resp:
        assert resp.status == 503
        assert await resp.json() == {"error": "gateway is shutting down"}


async def test_token_is_required_when_configured(tmp_path: Path, bus: MessageBus,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    channel = make_channel(tmp_path, bus, token=TOKEN)
    await channel.start()
    try:
        async with aiohttp.ClientSession(base_url=channel.base_url) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                async with http.post("/v1/messages", json=GOOD, headers=headers) as resp:
                    assert resp.status == 401
                    assert await resp.json() == {
                        "error": "authorization: missing or wrong bearer token"}
            async with http.get("/v1/health") as resp:
                assert resp.status == 401
            async with http.get("/nope") as resp:  # no route is told without the token
                assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with http.post("/v1/messages", json=GOOD, headers=auth) as resp:
                assert resp.status == 202
            assert bus.inbound_size == 1
    finally:
        await channel.stop()
    assert all(TOKEN not in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::"])
async def test_non_loopback_without_token_refuses_to_start(tmp_path: Path, bus: MessageBus,
                                                           host: str) -> None:
    channel = make_channel(tmp_path, bus, host=host)
    with pytest.raises(LocalChannelError, match="token"):
        await channel.start()
    assert not channel.status().running


def test_is_loopback() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "", "10.0.0.1", "::", "localhost.evil"))


async def test_health_includes_the_gateway_data(channel: LocalChannel,
                                                http: aiohttp.ClientSession) -> None:
    await channel.send(reply("c1", "x"))
    async with http.get("/v1/health") as resp:
        assert resp.status == 200
        data = await resp.json()
    assert data["status"] == "ok" and data["gateway"] == "up" and data["sessions"] == 3
    assert data["channels"]["local"] == {"running": True, "url": channel.base_url, "stored": 1}


async def test_unknown_route_and_method_are_json(http: aiohttp.ClientSession) -> None:
    async with http.get("/nope") as resp:
        assert resp.status == 404 and resp.content_type == "application/json"
        assert "error" in await resp.json()
    async with http.delete("/v1/messages") as resp:
        assert resp.status == 405 and resp.content_type == "application/json"


async def test_unexpected_error_is_500_json_and_logged(
        tmp_path: Path, bus: MessageBus, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("health exploded")

    config = LocalChannelConfig.model_validate({"port": 0})
    channel = LocalChannel(config, bus, workspace=tmp_path, health=broken)
    await channel.start()
    try:
        async with aiohttp.ClientSession(base_url=channel.base_url) as http:
            async with http.get("/v1/health") as resp:
                assert resp.status == 500
                assert await resp.json() == {"error": "internal error"}
    finally:
        await channel.stop()
    assert any("health exploded" in (r.exc_text or "") for r in caplog.records)


# --- hostile and broken clients -------------------------------------------------------------

@pytest.mark.parametrize(("body", "field"), [
    ('{"chat_id": "c1", "sender_id": "u1", "text": "a\\ud800b"}', "text:"),
    ('{"chat_id": "c\\udfff", "sender_id": "u1", "text": "hi"}', "chat_id:"),
    ('{"chat_id": "c1", "sender_id": "u1", "text": "hi", "sender_name": "\\ud800"}',
     "sender_name:"),
    ('{"chat_id": "c1", "sender_id": "u1", "text": "hi", '
     '"media": [{"data_base64": "AAAA", "mime": "image/png", "name": "x\\ud800.png"}]}',
     "media[0].name:"),
])
async def test_a_lone_surrogate_is_400_naming_the_field(
        http: aiohttp.ClientSession, bus: MessageBus, body: str, field: str,
        caplog: pytest.LogCaptureFixture) -> None:
    async with http.post("/v1/messages", data=body,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error == f"{field} contains a lone surrogate (not valid Unicode text)"
    assert bus.inbound_size == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # a proper pair (an emoji written as two escapes) is text like any other
    ok = '{"chat_id": "c1", "sender_id": "u1", "text": "\\ud83d\\ude00"}'
    async with http.post("/v1/messages", data=ok,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 202
    assert (await next_inbound(bus)).text == "\U0001f600"


async def raw_request(port: int, head: bytes, body: bytes) -> tuple[asyncio.StreamReader,
                                                                   asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    return reader, writer


async def test_a_body_that_never_arrives_in_full_is_408(tmp_path: Path, bus: MessageBus) -> None:
    """The client promises 100 bytes and sends 12, then waits: the answer can only be the
    408 (the server's timer decides, not the test's)."""
    channel = make_channel(tmp_path, bus, body_timeout="0.05s")
    await channel.start()
    try:
        assert channel.port is not None
        reader, writer = await raw_request(
            channel.port, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: 100\r\n\r\n", b'{"chat_id": ')
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        answer = head + await asyncio.wait_for(reader.readexactly(length), 10)
        writer.close()
    finally:
        await channel.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert b'"body: not received in full within 0.05 s (channels.local.body_timeout)"' in body
    assert bus.inbound_size == 0


async def test_a_client_that_disconnects_is_a_debug_line(
        channel: LocalChannel, bus: MessageBus, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="channels")
    assert channel.port is not None
    _, writer = await raw_request(
        channel.port, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 100\r\n\r\n", b'{"chat_id": ')
    writer.close()
    await writer.wait_closed()

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "disconnected" in r.getMessage()]

    await until(lambda: bool(said()), "the disconnect noticed")
    assert said()[0].levelno == logging.DEBUG
    assert said()[0].getMessage() == ("local channel: the client of POST /v1/messages "
                                      "disconnected")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert bus.inbound_size == 0
