"""What a browser page does to WebChat, for the WebChat tests: a socket (``Conn``) that reads
until the frame a test waits for, history over HTTP (``Page``), and a bare channel on a real
bus and store. Not a test module: ``test_webchat``, ``test_webchat_access`` and
``test_webchat_channel`` share it, and the fixtures of a whole gateway with WebChat on.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.webchat import WebchatChannel
from gateway.app import Gateway
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import WebchatChannelConfig
from gateway.kernel.store import Store
from tests.conftest import MakeConfig

CHAT = "chat-0001-aaaa"
OTHER = "chat-0002-bbbb"
TOKEN = "webchat-s3cret-token"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
                       "60e6kgAAAABJRU5ErkJggg==")
Frame = dict[str, Any]


class Conn:
    """One page's socket: send frames, read until the frame a test waits for."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.seen: list[Frame] = []

    async def send(self, **frame: Any) -> None:
        await self.ws.send_str(json.dumps(frame))

    async def message(self, text: str, message_id: str = "msg-00000001", **extra: Any) -> None:
        await self.send(type="message", chat_id=CHAT, message_id=message_id, text=text, **extra)

    async def until(self, want: Callable[[Frame], bool], timeout: float = 10) -> Frame:
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.ws.receive()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"socket ended ({msg.type}, {msg.data}); saw {self.seen}")
                frame = json.loads(msg.data)
                self.seen.append(frame)
                if want(frame):
                    return frame

    async def reply(self, kind: str = "reply") -> Frame:
        frame = await self.until(lambda f: f["type"] == "message"
                                 and f["message"]["role"] == "assistant"
                                 and f["message"]["kind"] == kind)
        return dict(frame["message"])

    async def error(self) -> Frame:
        return await self.until(lambda f: f["type"] == "error")


def is_type(kind: str) -> Callable[[Frame], bool]:
    return lambda f: f["type"] == kind


class Page:
    """What the browser page does, over aiohttp: history over HTTP, live frames over /ws."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base

    async def history(self, chat_id: str = CHAT, **params: Any) -> Frame:
        query = {"chat_id": chat_id, **{k: str(v) for k, v in params.items()}}
        async with self.http.get(f"{self.base}/api/history", params=query) as resp:
            assert resp.status == 200, await resp.text()
            return dict(await resp.json())

    async def connect(self, chat_id: str = CHAT, **kw: Any) -> Conn:
        kw.setdefault("origin", self.base)
        ws = await self.http.ws_connect(f"{self.base}/ws", params={"chat_id": chat_id}, **kw)
        conn = Conn(ws)
        await conn.until(is_type("ready"))
        return conn


def channel_of(gw: Gateway) -> WebchatChannel:
    channel = gw.manager.channels["webchat"]
    assert isinstance(channel, WebchatChannel)
    return channel


async def bare_channel(store: Store, tmp_path: Path, **config: Any) -> WebchatChannel:
    settings: dict[str, Any] = {"enabled": True, "port": 0, **config}
    channel = WebchatChannel(WebchatChannelConfig(**settings), MessageBus(), store,
                             workspace=tmp_path)
    await channel.start()
    return channel


@pytest.fixture
def webchat_config(make_config: MakeConfig) -> Callable[..., Any]:
    def make(**webchat: Any) -> Any:
        return make_config(channels={"webchat": {"enabled": True, "port": 0, **webchat}})
    return make


@pytest.fixture
async def gw(webchat_config: Callable[..., Any]) -> AsyncIterator[Gateway]:
    async with Gateway(webchat_config(), grace=2.0) as gateway:
        yield gateway


@pytest.fixture
async def page(gw: Gateway) -> AsyncIterator[Page]:
    async with aiohttp.ClientSession() as http:
        yield Page(http, str(channel_of(gw).base_url))
