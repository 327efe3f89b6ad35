"""WebChat over its real HTTP and WebSocket protocol: through a whole Gateway with the scripted
model where the agent matters, and a bare channel (real bus and store) where it does not."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.webchat import CLOSE_UNAUTHORIZED, WebchatChannel, WebchatError
from channels.webchat_frames import (
    host_allowed,
    human_bytes,
    origin_allowed,
    sniff_image,
)
from gateway.app import Gateway
from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.config import ConfigError, WebchatChannelConfig, parse_config
from gateway.kernel.events import ChatActivity, InboundMessage, OutboundMessage
from gateway.kernel.store import Store
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM

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


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    db = await Store.open(tmp_path / "db" / "parley.db")
    yield db
    await db.close()


async def bare_channel(store: Store, tmp_path: Path, **config: Any) -> WebchatChannel:
    settings: dict[str, Any] = {"enabled": True, "port": 0, **config}
    channel = WebchatChannel(WebchatChannelConfig(**settings), MessageBus(), store,
                             media_dir=tmp_path / "media")
    await channel.start()
    return channel


def reply(chat_id: str, text: str, **kw: Any) -> OutboundMessage:
    return OutboundMessage(channel="webchat", chat_id=chat_id, text=text, **kw)


# --- the page ---------------------------------------------------------------------------------

async def test_page_is_served_from_the_package_with_a_strict_csp(page: Page) -> None:
    for path, mime in (("/", "text/html"), ("/app.js", "text/javascript"),
                       ("/style.css", "text/css")):
        async with page.http.get(page.base + path) as resp:
            assert resp.status == 200 and resp.content_type == mime
            assert resp.headers["Content-Security-Policy"].startswith("default-src 'self'")
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            body = await resp.text()
        if path != "/app.js":
            assert "://" not in body  # no CDN, no external resource of any kind
    async with page.http.get(page.base + "/") as resp:
        assert '<script src="/app.js"' in await resp.text()
    async with page.http.get(page.base + "/api/info") as resp:
        info = await resp.json()
    assert info["token_required"] is False and info["max_image_bytes"] == 5 * 1024 * 1024


# --- through the whole gateway ------------------------------------------------------------------

async def test_message_round_trip_through_the_agent(page: Page, gw: Gateway,
                                                    llm: ScriptedLLM) -> None:
    llm.reply("Hi! **How** can I help?")
    conn = await page.connect()
    await conn.message("hello")
    ack = await conn.until(is_type("ack"))
    assert ack["message_id"] == "msg-00000001" and ack["duplicate"] is False
    answer = await conn.reply()
    assert answer["text"] == "Hi! **How** can I help?" and answer["reply_to"] == "msg-00000001"
    assert {"type": "typing", "busy": True} in conn.seen
    echoed = [f["message"] for f in conn.seen if f["type"] == "message"
              and f["message"]["role"] == "user"]
    assert [(m["text"], m["kind"], m["seq"]) for m in echoed] == [("hello", "user", ack["seq"])]

    runtime = llm.last_request["messages"][-2]["content"]
    assert "Channel: webchat" in runtime and f"Chat ID: {CHAT}" in runtime
    assert llm.last_request["messages"][-1] == {"role": "user", "content": "hello"}
    assert gw.store is not None
    assert (await gw.store.active_session(f"webchat:{CHAT}")).message_count == 2

    history = await page.history()
    assert [(m["role"], m["kind"], m["text"]) for m in history["messages"]] == [
        ("user", "user", "hello"), ("assistant", "reply", "Hi! **How** can I help?")]
    assert history["next"] == answer["seq"] > ack["seq"] and history["more"] is False
    assert (await page.history(after=ack["seq"]))["messages"][0]["seq"] == answer["seq"]
    assert (await page.history(OTHER))["messages"] == []


async def test_tool_progress_is_live_but_not_in_history(page: Page, llm: ScriptedLLM) -> None:
    llm.tool_call("list_dir", {"path": "."}).reply("Your files are listed.")
    conn = await page.connect()
    await conn.message("what files do I have?")
    progress = await conn.until(is_type("progress"))
    assert progress["text"] == "running list_dir"
    await conn.reply()
    kinds = [m["kind"] for m in (await page.history())["messages"]]
    assert kinds == ["user", "reply"]


async def test_slash_commands_work_and_new_starts_a_fresh_session(
        page: Page, gw: Gateway, llm: ScriptedLLM) -> None:
    llm.reply("noted")
    conn = await page.connect()
    await conn.message("my name is Ada", "msg-00000001")
    await conn.reply()
    await conn.message("/new", "msg-00000002")
    notice = await conn.reply("notice")
    assert "new conversation" in notice["text"]
    await conn.message("/help", "msg-00000003")
    assert "/status" in (await conn.reply("notice"))["text"]
    assert llm.calls == 1  # commands never reach the model
    assert gw.store is not None
    sessions = await gw.store.list_sessions(include_inactive=True)
    assert [(s.key, s.active) for s in sessions] == [(f"webchat:{CHAT}", True),
                                                     (f"webchat:{CHAT}", False)]
    users = [(m["text"], m["kind"]) for m in (await page.history())["messages"]
             if m["role"] == "user"]
    assert users == [("my name is Ada", "user"), ("/new", "command"), ("/help", "command")]


async def test_model_failure_is_shown_in_place_as_an_error(page: Page, llm: ScriptedLLM) -> None:
    for _ in range(4):
        llm.error(500, "internal")
    conn = await page.connect()
    await conn.message("hello")
    error = await conn.reply("error")
    assert "did not answer" in error["text"] and "Traceback" not in error["text"]
    assert [m["kind"] for m in (await page.history())["messages"]] == ["user", "error"]


async def test_a_resent_message_is_taken_once(page: Page, llm: ScriptedLLM) -> None:
    llm.reply("once")
    conn = await page.connect()
    await conn.message("hello", "msg-resent01")
    first = await conn.until(is_type("ack"))
    await conn.reply()
    second = await page.connect()  # the page reconnected and sends its unacknowledged message
    await second.message("hello", "msg-resent01")
    again = await second.until(is_type("ack"))
    assert again == {**first, "duplicate": True}
    assert llm.calls == 1
    assert [m["text"] for m in (await page.history())["messages"]] == ["hello", "once"]


async def test_image_reaches_the_model_and_the_history(page: Page, gw: Gateway,
                                                       llm: ScriptedLLM) -> None:
    llm.reply("A single pixel.")
    conn = await page.connect()
    image = {"data_base64": base64.b64encode(PNG).decode(), "mime": "image/png",
             "name": "../../evil.svg"}
    await conn.message("what is this?", image=image)
    await conn.reply()
    content = llm.last_request["messages"][-1]["content"]
    assert content[0]["text"].startswith("what is this?")
    assert content[1]["image_url"]["url"] == f"data:image/png;base64,{image['data_base64']}"

    (sent, _) = (await page.history())["messages"]
    assert sent["image"]["mime"] == "image/png" and sent["image"]["size"] == len(PNG)
    name = sent["image"]["name"]
    assert name.endswith(".png") and "evil" not in name
    assert (gw.config.data_path / "media" / "webchat" / name).read_bytes() == PNG
    url = f"{page.base}/api/media/{name}"
    async with page.http.get(url, params={"chat_id": CHAT}) as resp:
        assert resp.status == 200 and resp.content_type == "image/png"
        assert await resp.read() == PNG
    async with page.http.get(url, params={"chat_id": OTHER}) as resp:
        assert resp.status == 404  # another chat never reads this chat's images


async def test_oversize_image_is_refused_with_the_limit(webchat_config: Callable[..., Any],
                                                        llm: ScriptedLLM) -> None:
    async with Gateway(webchat_config(max_image_bytes=1024)) as gw, \
            aiohttp.ClientSession() as http:
        page = Page(http, str(channel_of(gw).base_url))
        conn = await page.connect()
        big = base64.b64encode(PNG + b"\0" * 1100).decode()
        await conn.message("look", image={"data_base64": big, "mime": "image/png"})
        error = await conn.error()
        assert error == {"type": "error", "error": "image: larger than the 1 KB limit",
                         "message_id": "msg-00000001", "retry": False}
        assert (await page.history())["messages"] == []
        media = gw.config.data_path / "media" / "webchat"
        assert not media.exists() or not any(media.iterdir())
    assert llm.calls == 0


BAD_FRAMES: list[tuple[str, str]] = [
    ("not json", "frame: not valid JSON"),
    ("[1, 2]", "frame: must be a JSON object"),
    ("{}", "type: required"),
    ('{"type": "dance"}', "type: unknown frame type 'dance'"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "text": "hi"}', "message_id: required"),
    ('{"type": "message", "chat_id": "' + OTHER + '", "message_id": "msg-00000001", "text": "x"}',
     "chat_id: must be the chat this connection was opened for"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": 5}',
     "text: must be a string"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": " "}',
     "text: required, unless an image is sent"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": "x",'
     ' "sender": "admin"}', "sender: unknown field"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": "x",'
     ' "image": {"data_base64": "AAAA", "mime": "image/svg+xml"}}', "image.mime: must be one of"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": "x",'
     ' "image": {"data_base64": "***", "mime": "image/png"}}',
     "image.data_base64: not valid base64"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": "x",'
     ' "image": {"data_base64": "/9j/4AAQ", "mime": "image/png"}}',
     "image.data_base64: not a image/png image"),
]


async def test_bad_frames_get_an_error_naming_the_field(page: Page, llm: ScriptedLLM) -> None:
    conn = await page.connect()
    for raw, expected in BAD_FRAMES:
        await conn.ws.send_str(raw)
        error = await conn.error()
        assert error["error"].startswith(expected), (raw, error)
        assert error["retry"] is False
    await conn.ws.send_bytes(b"\x00")
    assert (await conn.error())["error"] == "frame: must be JSON text"
    await conn.send(type="ping")
    await conn.until(is_type("pong"))  # the socket is still usable after all that
    assert llm.calls == 0 and (await page.history())["messages"] == []


@pytest.mark.parametrize(("params", "field"), [
    ({}, "chat_id:"), ({"chat_id": "short"}, "chat_id:"), ({"chat_id": "a/b/c/d/e/f"}, "chat_id:"),
    ({"chat_id": CHAT, "after": "-1"}, "after:"), ({"chat_id": CHAT, "limit": "x"}, "limit:"),
    ({"chat_id": CHAT, "after": "1", "before": "3"}, "before:"),
])
async def test_bad_history_query_is_400_naming_the_field(page: Page, params: dict[str, str],
                                                         field: str) -> None:
    async with page.http.get(f"{page.base}/api/history", params=params) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"].startswith(field)


async def test_reconnect_after_a_gateway_restart_gets_the_history(
        webchat_config: Callable[..., Any], llm: ScriptedLLM) -> None:
    llm.reply("before the restart")
    config = webchat_config()
    async with aiohttp.ClientSession() as http:
        async with Gateway(config) as gw:
            page = Page(http, str(channel_of(gw).base_url))
            conn = await page.connect()
            await conn.message("hello", "msg-restart1")
            await conn.reply()
        closed = await conn.ws.receive()  # the gateway closed the socket while stopping
        assert (closed.type, closed.data) == (aiohttp.WSMsgType.CLOSE,
                                              aiohttp.WSCloseCode.GOING_AWAY)

        async with Gateway(config) as gw:
            page = Page(http, str(channel_of(gw).base_url))
            history = await page.history(after=0)
            assert [m["text"] for m in history["messages"]] == ["hello", "before the restart"]
            conn = await page.connect()
            await conn.message("hello", "msg-restart1")  # still unacknowledged on that page
            assert (await conn.until(is_type("ack")))["duplicate"] is True
    assert llm.calls == 1


# --- origin, host and token ---------------------------------------------------------------------

async def test_socket_from_another_origin_is_refused(page: Page) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await page.connect(origin="http://evil.example")
    assert refused.value.status == 403
    await page.connect()  # the page's own origin
    await page.connect(origin=None)  # not a browser: no Origin header at all


async def test_allowed_origins_may_open_the_socket(store: Store, tmp_path: Path) -> None:
    channel = await bare_channel(store, tmp_path, allowed_origins=["https://Chat.Example.com/"])
    try:
        async with aiohttp.ClientSession() as http:
            page = Page(http, str(channel.base_url))
            await page.connect(origin="https://chat.example.com")
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await page.connect(origin="https://chat.example.com.evil.example")
    finally:
        await channel.stop()


async def test_without_a_token_only_loopback_host_names_are_served(page: Page) -> None:
    async with page.http.get(page.base + "/", headers={"Host": "rebound.evil.example"}) as resp:
        assert resp.status == 403
        assert "channels.webchat.token" in (await resp.json())["error"]
    async with page.http.get(page.base + "/", headers={"Host": "localhost:1234"}) as resp:
        assert resp.status == 200


async def test_token_is_required_everywhere_but_the_page(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    channel = await bare_channel(store, tmp_path, token=TOKEN)
    try:
        async with aiohttp.ClientSession() as http:
            page = Page(http, str(channel.base_url))
            async with http.get(page.base + "/api/info") as resp:
                assert (await resp.json())["token_required"] is True
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                async with http.get(page.base + "/api/history", params={"chat_id": CHAT},
                                    headers=headers) as resp:
                    assert resp.status == 401
                    assert await resp.json() == {
                        "error": "authorization: missing or wrong token"}
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(page.base + "/api/history", params={"chat_id": CHAT},
                                headers=auth) as resp:
                assert resp.status == 200
            # A rebound host name is fine once a token guards everything.
            async with http.get(page.base + "/", headers={"Host": "chat.lan:80"}) as resp:
                assert resp.status == 200

            for first in ({"type": "ping"}, {"type": "auth", "token": "wrong"}):
                ws = await http.ws_connect(f"{page.base}/ws", params={"chat_id": CHAT},
                                           origin=page.base)
                await ws.send_str(json.dumps(first))
                frame = await ws.receive_json()
                assert frame["error"] == "token: missing or wrong"
                closed = await ws.receive()
                assert (closed.type, closed.data) == (aiohttp.WSMsgType.CLOSE,
                                                      CLOSE_UNAUTHORIZED)
                await ws.close()
            ws = await http.ws_connect(f"{page.base}/ws", params={"chat_id": CHAT},
                                       origin=page.base)
            await ws.send_str(json.dumps({"type": "auth", "token": TOKEN}))
            assert (await ws.receive_json())["type"] == "ready"
            await ws.close()
            conn = await page.connect(headers=auth)  # a script may use the header instead
            await conn.ws.close()
    finally:
        await channel.stop()
    assert caplog.records
    assert all(TOKEN not in r.getMessage() and TOKEN not in str(r.args) for r in caplog.records)


def test_config_refuses_non_loopback_without_a_token() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"channels": {"webchat": {"enabled": True, "host": "0.0.0.0"}}}, env={})
    assert refused.value.errors[0][0] == "channels.webchat.token"
    assert "channels.webchat.token is required" in refused.value.errors[0][1]
    ok = parse_config({"channels": {"webchat": {"host": "0.0.0.0", "token": TOKEN}}}, env={})
    assert ok.channels.webchat.token == TOKEN
    loopback = parse_config({"channels": {"webchat": {"host": "::1", "token": ""}}}, env={})
    assert loopback.channels.webchat.token is None
    with pytest.raises(ConfigError, match="allowed_origins"):
        parse_config({"channels": {"webchat": {"allowed_origins": ["chat.example.com"]}}}, env={})


async def test_channel_refuses_to_start_beyond_loopback_without_a_token(
        store: Store, tmp_path: Path) -> None:
    config = WebchatChannelConfig.model_construct(
        **{**WebchatChannelConfig().model_dump(), "host": "0.0.0.0", "enabled": True})
    channel = WebchatChannel(config, MessageBus(), store, media_dir=tmp_path)
    with pytest.raises(WebchatError, match="channels.webchat.token"):
        await channel.start()
    assert not channel.status().running


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


def test_origin_and_host_checks() -> None:
    def own(origin: str | None) -> bool:
        return origin_allowed(origin, scheme="http", host_header="127.0.0.1:8766", allowed=[])

    assert own("http://127.0.0.1:8766") and own("HTTP://127.0.0.1:8766/")
    assert not own("http://localhost:8766") and not own("null") and not own("https://127.0.0.1:8766")
    assert own(None)  # not a browser: the token, not the origin, keeps those out
    for host in ("127.0.0.1:8766", "localhost", "[::1]:8766", "127.0.0.2"):
        assert host_allowed(host, allowed_origins=[])
    for host in ("evil.example", "localhost.evil.example:8766", "0.0.0.0", ""):
        assert not host_allowed(host, allowed_origins=[])
    assert host_allowed("chat.example.com", allowed_origins=["https://chat.example.com"])


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (512, 1024, 1536, 5 * 1024 * 1024)] == [
        "512 bytes", "1 KB", "1.5 KB", "5 MB"]
