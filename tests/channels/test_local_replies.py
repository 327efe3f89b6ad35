"""The local channel's replies: records read over HTTP and in process, long polls woken by
their own chat only, idempotent sends, bounded memory, ``ask`` and a stop that wakes every
poll.

Split from ``test_local.py`` (what a POST may carry, the token, health and errors); its
``reply`` is shared, and the channel fixtures are in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels import local, local_log
from channels.base import ChannelDeps
from channels.local import MAX_RECORDS_PER_CHAT, LocalChannel, parse_poll_query
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import LocalChannelConfig, parse_config
from gateway.kernel.store import Store
from tests.channels.conftest import make_channel
from tests.channels.test_local import reply


def waiting_spy(channel: LocalChannel, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set when a poll begins; nothing yields between that and the wait itself."""
    started = asyncio.Event()
    original = channel.wait_messages

    async def spy(chat_id: str, **kw: Any) -> tuple[list[dict[str, Any]], int]:
        started.set()
        return await original(chat_id, **kw)

    monkeypatch.setattr(channel, "wait_messages", spy)
    return started


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
    poll = asyncio.create_task(
        http.get("/v1/messages", params={"chat_id": "c1", "wait": "60"}), name="test-poll")
    await asyncio.wait_for(started.wait(), 10)
    await channel.send(reply("other", "not for c1"))
    await channel.send(reply("c1", "now"))
    async with await asyncio.wait_for(poll, 10) as resp:  # woken long before its 60 s
        data = await resp.json()
    assert [m["text"] for m in data["messages"]] == ["now"] and data["next"] == 2


async def test_long_poll_without_messages_returns_empty_after_wait(
        channel: LocalChannel, http: aiohttp.ClientSession) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with http.get("/v1/messages",
                        params={"chat_id": "c1", "after": "7", "wait": "0.2"}) as resp:
        assert await resp.json() == {"messages": [], "next": 7}
    assert loop.time() - t0 >= 0.15  # it waited (a lower bound: a busy machine only adds)


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
    other = asyncio.create_task(channel.wait_messages("c2", timeout=60))
    mine = asyncio.create_task(channel.wait_messages("c1", timeout=60))
    await asyncio.sleep(0)  # both are waiting now
    await channel.send(reply("c1", "for c1"))
    found, _ = await asyncio.wait_for(mine, 10)  # woken long before its 60 s
    assert [m["text"] for m in found] == ["for c1"]
    assert not other.done()
    await channel.send(reply("c2", "for c2"))
    assert [m["text"] for m in (await asyncio.wait_for(other, 10))[0]] == ["for c2"]


async def test_memory_is_bounded_per_chat(channel: LocalChannel) -> None:
    for i in range(MAX_RECORDS_PER_CHAT + 5):
        await channel.send(reply("c1", f"m{i}"))
    found, next_seq = await channel.wait_messages("c1", timeout=0)
    assert len(found) == MAX_RECORDS_PER_CHAT
    assert found[0]["text"] == "m5" and next_seq == MAX_RECORDS_PER_CHAT + 5


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
    channel = LocalChannel(config, bus, workspace=tmp_path, serve_http=False)
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
    async with aiohttp.ClientSession(base_url=channel.base_url) as http:
        poll = asyncio.create_task(
            http.get("/v1/messages", params={"chat_id": "c1", "wait": "60"}), name="test-poll")
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.wait_for(channel.stop(), 10)
        async with await asyncio.wait_for(poll, 10) as resp:  # woken long before its 60 s
            assert await resp.json() == {"messages": [], "next": 0}
    await channel.stop()
    assert not channel.status().running
    left = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert left == set()


async def test_replies_and_seq_outlive_the_channel_with_a_store(
        tmp_path: Path, bus: MessageBus, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept in the database: numbered on after a restart, unread ones still there, a resent
    reply (same idempotency key) neither renumbered nor shown twice, and numbers never reused
    once old rows are pruned."""
    monkeypatch.setattr(local_log, "MAX_KEPT", 3)
    monkeypatch.setattr(local_log, "PRUNE_EVERY", 2)
    config = parse_config({"workspace": str(tmp_path / "ws"), "data_dir": str(tmp_path),
                           "channels": {"local": {"port": 0}}}, env={})

    async def channel() -> LocalChannel:
        """Made as the gateway makes it (``create``), which hands over the store."""
        made = local.create(ChannelDeps(config=config, bus=bus, store=store,
                                        data_path=config.data_path, health=dict))
        await made.start()
        return made

    first = await channel()
    first_reply = reply("c1", "one")
    sent = [await first.send(first_reply), await first.send(reply("c1", "two"))]
    assert [d.message_ids for d in sent] == [("1",), ("2",)]
    await first.stop()

    second = await channel()
    found, after = await second.wait_messages("c1", after=1, timeout=0)
    assert [r["text"] for r in found] == ["two"] and after == 2
    assert (await second.send(first_reply)).message_ids == ("1",)  # a resend: the same seq
    for text in ("three", "four", "five"):
        await second.send(reply("c1", text))
    await second.stop()

    third = await channel()
    found, after = await third.wait_messages("c1", after=0, timeout=0)
    assert [r["text"] for r in found] == ["two", "three", "four", "five"]  # "one" pruned
    assert after == 5
    assert (await third.send(reply("c1", "six"))).message_ids == ("6",)
    await third.stop()
