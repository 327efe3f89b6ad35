"""WebChat's channel on its own (real bus and store, no agent): history kept for pages that
were closed, paging, typing and progress to every page of a chat, a closed bus, a message
published again after a refusal, and a stop that leaves no task; plus its pure helpers.

Split from ``test_webchat.py``; the page helpers are in ``webchat_page.py``, the ``store``
fixture in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.webchat_frames import human_bytes, sniff_image
from gateway.kernel.bus import BusClosed
from gateway.kernel.events import ChatActivity, InboundMessage, OutboundMessage
from gateway.kernel.store import Store
from tests.channels.webchat_page import (
    CHAT,
    OTHER,
    PNG,
    Conn,
    Page,
    bare_channel,
    is_type,
)


def reply(chat_id: str, text: str, **kw: Any) -> OutboundMessage:
    return OutboundMessage(channel="webchat", chat_id=chat_id, text=text, **kw)


# --- the channel on its own ---------------------------------------------------------------------

async def test_send_logs_for_history_when_no_page_is_open(store: Store, tmp_path: Path) -> None:
    channel = await bare_channel(store, tmp_path)
    try:
        msg = reply(CHAT, "while you were away", kind="notice")
        delivery = await channel.send(msg)
        assert delivery.ok and await channel.send(msg) == delivery  # idempotent on its key
        assert (await channel.send(reply(CHAT, "running exec", kind="progress"))).ok
        async with aiohttp.ClientSession() as http:
            data = await Page(http, str(channel.base_url)).history()
        assert [(m["kind"], m["text"]) for m in data["messages"]] == [
            ("notice", "while you were away")]
        assert data["next"] == int(delivery.message_ids[0])
    finally:
        await channel.stop()


async def test_history_pages_back_and_forth(store: Store, tmp_path: Path) -> None:
    channel = await bare_channel(store, tmp_path, history_limit=2)
    try:
        for i in range(5):
            await channel.send(reply(CHAT, f"m{i}"))
        await channel.send(reply(OTHER, "elsewhere"))
        async with aiohttp.ClientSession() as http:
            page = Page(http, str(channel.base_url))
            newest = await page.history()
            assert [m["text"] for m in newest["messages"]] == ["m3", "m4"] and newest["more"]
            first_seq = newest["messages"][0]["seq"]
            older = await page.history(before=first_seq, limit=50)
            assert [m["text"] for m in older["messages"]] == ["m1", "m2"] and older["more"]
            start = await page.history(after=0)
            assert [m["text"] for m in start["messages"]] == ["m0", "m1"] and start["more"]
            rest = await page.history(after=start["next"])
            assert [m["text"] for m in rest["messages"]] == ["m2", "m3"]
            end = await page.history(after=newest["next"])
            assert end == {"messages": [], "next": newest["next"], "more": False, "busy": False}
    finally:
        await channel.stop()


async def test_typing_and_progress_reach_every_page_of_the_chat(store: Store,
                                                                tmp_path: Path) -> None:
    channel = await bare_channel(store, tmp_path)
    try:
        async with aiohttp.ClientSession() as http:
            page = Page(http, str(channel.base_url))
            first, other = await page.connect(), await page.connect(OTHER)
            channel.activity(ChatActivity(channel="webchat", chat_id=CHAT))
            assert await first.until(is_type("typing")) == {"type": "typing", "busy": True}
            await channel.send(reply(CHAT, "running read_file", kind="progress"))
            assert (await first.until(is_type("progress")))["text"] == "running read_file"
            # A page opened mid-turn (a reload) sees the turn and its progress so far.
            late = Conn(await http.ws_connect(f"{page.base}/ws", params={"chat_id": CHAT}))
            ready = await late.until(is_type("ready"))
            assert ready["busy"] is True and ready["progress"] == ["running read_file"]
            assert channel.status().detail["sockets"] == 3
            channel.activity(ChatActivity(channel="webchat", chat_id=CHAT, busy=False))
            for conn in (first, late):
                assert (await conn.until(is_type("typing")))["busy"] is False
            await other.send(type="ping")
            assert await other.until(lambda f: f["type"] != "ready") == {"type": "pong"}
    finally:
        await channel.stop()


async def test_closed_bus_asks_the_page_to_send_again_later(store: Store,
                                                             tmp_path: Path) -> None:
    channel = await bare_channel(store, tmp_path)
    try:
        async with aiohttp.ClientSession() as http:
            conn = await Page(http, str(channel.base_url)).connect()
            channel._bus.close()
            await conn.message("hello")
            error = await conn.error()
            assert error["retry"] is True and error["message_id"] == "msg-00000001"
            assert "sent again" in error["error"]
    finally:
        await channel.stop()


async def test_a_message_the_bus_refused_is_published_when_sent_again(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = await bare_channel(store, tmp_path)
    bus = channel._bus
    publish = bus.publish_inbound

    async def closing_under_it(msg: InboundMessage) -> bool:
        monkeypatch.setattr(bus, "publish_inbound", publish)
        raise BusClosed("closed between logging and publishing")

    monkeypatch.setattr(bus, "publish_inbound", closing_under_it)
    try:
        async with aiohttp.ClientSession() as http:
            page = Page(http, str(channel.base_url))
            conn = await page.connect()
            await conn.message("hello")
            assert (await conn.error())["retry"] is True
            (logged,) = (await page.history())["messages"]
            assert logged["pending"] is True and bus.inbound_size == 0
            await conn.message("hello")  # the page sends it again after reconnecting
            ack = await conn.until(is_type("ack"))
            assert ack["duplicate"] is False and ack["seq"] == logged["seq"]
            assert (await bus.consume_inbound()).message_id == "msg-00000001"
            (logged,) = (await page.history())["messages"]
            assert logged["pending"] is False
    finally:
        await channel.stop()


async def test_stop_closes_sockets_and_leaves_no_task(store: Store, tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    channel = await bare_channel(store, tmp_path)
    async with aiohttp.ClientSession() as http:
        conn = await Page(http, str(channel.base_url)).connect()
        assert channel.status().running
        await asyncio.wait_for(channel.stop(), 5)
        closed = await conn.ws.receive()
        assert (closed.type, closed.data) == (aiohttp.WSMsgType.CLOSE,
                                              aiohttp.WSCloseCode.GOING_AWAY)
    await channel.stop()
    status = channel.status()
    assert not status.running and status.detail["sockets"] == 0
    left = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert left == set()


# --- pure helpers -------------------------------------------------------------------------------

def test_sniff_image_knows_the_raster_formats_only() -> None:
    assert sniff_image(PNG) == "image/png"
    assert sniff_image(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert sniff_image(b"GIF89a...") == "image/gif"
    assert sniff_image(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert sniff_image(b"<svg onload=alert(1)>") is None


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (512, 1024, 1536, 5 * 1024 * 1024)] == [
        "512 bytes", "1 KB", "1.5 KB", "5 MB"]
