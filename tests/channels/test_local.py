"""The local channel, driven over real HTTP with a real bus."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.base import Channel
from channels.local import (
    MAX_RECORDS_PER_CHAT,
    LocalChannel,
    LocalChannelError,
    is_loopback,
    parse_poll_query,
)
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import LocalChannelConfig
from gateway.kernel.events import InboundMessage, OutboundMessage

TOKEN = "s3cret-token-value"


def make_channel(tmp_path: Path, bus: MessageBus, **config: Any) -> LocalChannel:
    settings: dict[str, Any] = {"port": 0, "max_text_chars": 1000, "max_media_bytes": 1024}
    settings.update(config)
    return LocalChannel(LocalChannelConfig(**settings), bus, media_dir=tmp_path / "media",
                        health=lambda: {"gateway": "up", "sessions": 3})


@pytest.fixture
def bus() -> MessageBus:
    return MessageBus()


@pytest.fixture
async def channel(tmp_path: Path, bus: MessageBus) -> AsyncIterator[LocalChannel]:
    ch = make_channel(tmp_path, bus)
    await ch.start()
    yield ch
    await ch.stop()


@pytest.fixture
async def http(channel: LocalChannel) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=channel.base_url) as session:
        yield session


async def next_inbound(bus: MessageBus) -> InboundMessage:
    return await asyncio.wait_for(bus.consume_inbound(), 5)


def reply(chat_id: str, text: str, **kw: Any) -> OutboundMessage:
    return OutboundMessage(channel="local", chat_id=chat_id, text=text, **kw)


def waiting_spy(channel: LocalChannel, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set when a poll begins; nothing yields between that and the wait itself."""
    started = asyncio.Event()
    original = channel.wait_messages

    async def spy(chat_id: str, **kw: Any) -> tuple[list[dict[str, Any]], int]:
        started.set()
        return await original(chat_id, **kw)

    monkeypatch.setattr(channel, "wait_messages", spy)
    return started


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


async def test_base64_media_is_saved_under_media_dir(http: aiohttp.ClientSession,
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
    assert saved.parent == tmp_path / "media"
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
    (item,) = (await next_inbound(bus)).media
    assert (item.kind, item.path, item.size) == ("audio", str(song), 100)


async def test_closed_bus_is_503(http: aiohttp.ClientSession, bus: MessageBus) -> None:
    bus.close()
    async with http.post("/v1/messages", json=GOOD) as resp:
        assert resp.status == 503
        assert await resp.json() == {"error": "gateway is shutting down"}


async def test_send_then_get_returns_records_and_next(channel: LocalChannel,
                                                      http: aiohttp.ClientSession) -> None:
    first = await channel.send(reply("c1", "one", turn_id="t1"))
    await channel.send(reply("other", "elsewhere"))
    await channel.send(reply("c1", "two", kind="progress", thread_id="th"))
    assert first.ok and first.message_ids == ("1",)
    async with http.get("/v1/messages", params={"chat_id": "c1"}) as resp:
        assert resp.status == 200
        data = await resp.json()
    assert [m["text"] for m in data["messages"]] == ["one", "two"]
    assert [m["seq"] for m in data["messages"]] == [1, 3]
    assert data["next"] == 3
    record = data["messages"][0]
    assert set(record) >= {"seq", "chat_id", "text", "kind", "reply_to", "media", "created_at"}
    assert record["created_at"].endswith("+00:00") and record["turn_id"] == "t1"
    assert data["messages"][1]["kind"] == "progress"
    async with http.get("/v1/messages", params={"chat_id": "c1", "after": "1"}) as resp:
        data = await resp.json()
    assert [m["text"] for m in data["messages"]] == ["two"]
    async with http.get("/v1/messages", params={"chat_id": "c1", "after": "3"}) as resp:
        assert await resp.json() == {"messages": [], "next": 3}


@pytest.mark.parametrize(("params", "field"), [
    ({}, "chat_id:"),
    ({"chat_id": "c1", "after": "-1"}, "after:"),
    ({"chat_id": "c1", "after": "x"}, "after:"),
    ({"chat_id": "c1", "wait": "soon"}, "wait:"),
    ({"chat_id": "c1", "wait": "-2"}, "wait:"),
    ({"chat_id": "c1", "wait": "nan"}, "wait:"),
])
async def test_bad_poll_query_is_400(http: aiohttp.ClientSession, params: dict[str, str],
                                     field: str) -> None:
    async with http.get("/v1/messages", params=params) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"].startswith(field)


def test_wait_is_capped_at_60_seconds() -> None:
    assert parse_poll_query({"chat_id": "c", "wait": "600"}) == ("c", 0, 60.0)
    assert parse_poll_query({"chat_id": "c", "after": "4", "wait": "1.5"}) == ("c", 4, 1.5)


async def test_long_poll_returns_when_a_message_arrives(
        channel: LocalChannel, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    started = waiting_spy(channel, monkeypatch)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    poll = asyncio.create_task(
        http.get("/v1/messages", params={"chat_id": "c1", "wait": "30"}), name="test-poll")
    await asyncio.wait_for(started.wait(), 5)
    await channel.send(reply("other", "not for c1"))
    await channel.send(reply("c1", "now"))
    async with await asyncio.wait_for(poll, 5) as resp:
        data = await resp.json()
    assert loop.time() - t0 < 5
    assert [m["text"] for m in data["messages"]] == ["now"] and data["next"] == 2


async def test_long_poll_without_messages_returns_empty_after_wait(
        channel: LocalChannel, http: aiohttp.ClientSession) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with http.get("/v1/messages",
                        params={"chat_id": "c1", "after": "7", "wait": "0.2"}) as resp:
        assert await resp.json() == {"messages": [], "next": 7}
    assert 0.15 <= loop.time() - t0 < 5


async def test_send_is_idempotent(channel: LocalChannel) -> None:
    msg = reply("c1", "once")
    first = await channel.send(msg)
    assert await channel.send(msg) == first
    found, next_seq = await channel.wait_messages("c1", timeout=0)
    assert [m["text"] for m in found] == ["once"] and next_seq == 1
    assert channel.status().detail["stored"] == 1


async def test_memory_is_bounded_across_chats(channel: LocalChannel,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("channels.local.MAX_RECORDS", 5)
    for i in range(4):
        await channel.send(reply("old", f"o{i}"))
    for i in range(4):
        await channel.send(reply("new", f"n{i}"))
    assert channel.status().detail["stored"] == 5
    old, _ = await channel.wait_messages("old", timeout=0)
    new, _ = await channel.wait_messages("new", timeout=0)
    assert [m["text"] for m in old] == ["o3"]  # the least recent chat gives way first
    assert [m["text"] for m in new] == ["n0", "n1", "n2", "n3"]


async def test_a_reply_wakes_only_its_own_chat(channel: LocalChannel) -> None:
    other = asyncio.create_task(channel.wait_messages("c2", timeout=5))
    mine = asyncio.create_task(channel.wait_messages("c1", timeout=5))
    await asyncio.sleep(0)  # both are waiting now
    await channel.send(reply("c1", "for c1"))
    found, _ = await asyncio.wait_for(mine, 1)
    assert [m["text"] for m in found] == ["for c1"]
    assert not other.done()
    await channel.send(reply("c2", "for c2"))
    assert [m["text"] for m in (await asyncio.wait_for(other, 1))[0]] == ["for c2"]


async def test_memory_is_bounded_per_chat(channel: LocalChannel) -> None:
    for i in range(MAX_RECORDS_PER_CHAT + 5):
        await channel.send(reply("c1", f"m{i}"))
    found, next_seq = await channel.wait_messages("c1", timeout=0)
    assert len(found) == MAX_RECORDS_PER_CHAT
    assert found[0]["text"] == "m5" and next_seq == MAX_RECORDS_PER_CHAT + 5


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
    channel = LocalChannel(config, bus, media_dir=tmp_path, health=broken)
    await channel.start()
    try:
        async with aiohttp.ClientSession(base_url=channel.base_url) as http:
            async with http.get("/v1/health") as resp:
                assert resp.status == 500
                assert await resp.json() == {"error": "internal error"}
    finally:
        await channel.stop()
    assert any("health exploded" in (r.exc_text or "") for r in caplog.records)


async def fake_agent(bus: MessageBus, channel: LocalChannel) -> None:
    while True:
        msg = await bus.consume_inbound()
        await channel.send(reply(msg.chat_id, "thinking…", kind="progress"))
        await channel.send(reply(msg.chat_id, f"echo: {msg.text}", reply_to=msg.message_id))


async def run_with_agent(bus: MessageBus, channel: LocalChannel,
                         body: Callable[[], Awaitable[None]]) -> None:
    agent = asyncio.create_task(fake_agent(bus, channel), name="fake-agent")
    try:
        await body()
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)


async def test_ask_round_trip_in_process(tmp_path: Path, bus: MessageBus) -> None:
    config = LocalChannelConfig.model_validate({})
    channel = LocalChannel(config, bus, media_dir=tmp_path, serve_http=False)
    await channel.start()

    async def body() -> None:
        await channel.send(reply("c1", "an old reply"))
        assert await channel.ask("c1", "hello", timeout=5) == "echo: hello"
        assert await channel.ask("c1", "again", sender_id="u2", timeout=5) == "echo: again"

    await run_with_agent(bus, channel, body)
    assert channel.base_url is None and channel.status().running
    await channel.stop()


async def test_ask_times_out_without_an_answer(channel: LocalChannel) -> None:
    with pytest.raises(TimeoutError):
        await channel.ask("c1", "anyone?", timeout=0.1)


async def test_stop_wakes_long_poll_and_is_safe_twice(
        tmp_path: Path, bus: MessageBus, monkeypatch: pytest.MonkeyPatch) -> None:
    before = asyncio.all_tasks()
    channel = make_channel(tmp_path, bus)
    await channel.start()
    started = waiting_spy(channel, monkeypatch)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(base_url=channel.base_url) as http:
        t0 = loop.time()
        poll = asyncio.create_task(
            http.get("/v1/messages", params={"chat_id": "c1", "wait": "30"}), name="test-poll")
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.wait_for(channel.stop(), 5)
        async with await asyncio.wait_for(poll, 5) as resp:
            assert await resp.json() == {"messages": [], "next": 0}
        assert loop.time() - t0 < 5
    await channel.stop()
    assert not channel.status().running
    left = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert left == set()
