"""WebChat over its real HTTP and WebSocket protocol: the page, and messages through a whole
Gateway with the scripted model. Access rules (origin, host, token) are in
``test_webchat_access.py``, the bare channel (real bus and store, no agent) in
``test_webchat_channel.py``; the page helpers are in ``webchat_page.py``."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.kernel.store import Store
from tests.channels.webchat_page import (
    CHAT,
    OTHER,
    PNG,
    Page,
    bare_channel,
    channel_of,
    is_type,
)
from tests.fakes.openai_server import ScriptedLLM

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
    assert (gw.config.workspace_path / "inbox" / "webchat" / CHAT / name).read_bytes() == PNG
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
        media = gw.config.workspace_path / "inbox"
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
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", '
     '"text": "a\\ud800"}', "text: contains a lone surrogate"),
    ('{"type": "message", "chat_id": "' + CHAT + '", "message_id": "msg-00000001", "text": " "}',
     "text: required, unless an image or a recording is sent"),
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
        while closed.type == aiohttp.WSMsgType.TEXT:  # after the turn's last status frames
            assert "busy" in closed.json()
            closed = await conn.ws.receive()
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


async def test_a_message_the_store_cannot_keep_is_not_acknowledged(
        page: Page, gw: Gateway, llm: ScriptedLLM) -> None:
    """The database deleted under a running gateway: an error frame the page retries on, and
    no ack (the page keeps the message in its outbox) — never an ack for a lost message."""
    conn = await page.connect()
    shutil.rmtree(gw.config.data_path)
    await conn.message("keep me", message_id="msg-lost-0001")
    error = await conn.error()
    assert error["error"].startswith("store: the gateway cannot store messages right now")
    assert error["retry"] is True and error["message_id"] == "msg-lost-0001"
    assert llm.calls == 0
    assert gw.health()["status"] == "degraded"


# --- past conversations (webchat_chats) -------------------------------------------------------

async def test_the_markdown_library_is_served_from_the_package(page: Page) -> None:
    async with page.http.get(page.base + "/vendor/markdown-it.min.js") as resp:
        assert resp.status == 200 and resp.content_type == "text/javascript"
        assert (await resp.text()).startswith("/*! markdown-it 14.3.3")
    async with page.http.get(page.base + "/") as resp:
        html = await resp.text()
    assert html.index('src="/vendor/markdown-it.min.js"') < html.index('src="/app.js"')


async def test_conversations_are_listed_per_browser_newest_first(
        page: Page, llm: ScriptedLLM) -> None:
    llm.echo()
    profile, stranger = "profile-0001", "profile-0002"

    async def register(body: Any) -> tuple[int, Any]:
        async with page.http.post(f"{page.base}/api/conversations", json=body) as resp:
            return resp.status, await resp.json()

    async def listed(who: str) -> list[tuple[str, str]]:
        async with page.http.get(f"{page.base}/api/conversations",
                                 params={"profile": who}) as resp:
            assert resp.status == 200
            return [(c["chat_id"], c["title"]) for c in (await resp.json())["conversations"]]

    for chat in (CHAT, OTHER, "empty-chat-0001"):
        assert await register({"profile": profile, "chat_id": chat}) == (200, {"ok": True})
    assert await register({"profile": stranger, "chat_id": CHAT}) == (200, {"ok": True})
    for chat, text in ((CHAT, "first " + "x" * 100), (OTHER, "second")):
        conn = await page.connect(chat)
        await conn.send(type="message", chat_id=chat, message_id="msg-00000001", text=text)
        await conn.reply()
        await conn.ws.close()
    assert await listed(profile) == [(OTHER, "second"), (CHAT, "first " + "x" * 74)]
    assert await listed(stranger) == []  # a chat id belongs to whoever registered it first


@pytest.mark.parametrize(("body", "status", "error"), [
    ({"profile": "short", "chat_id": CHAT}, 400, "profile: required, 8 to 64"),
    ({"profile": "profile-0001"}, 400, "chat_id: required, 8 to 64"),
    ({"profile": "profile-0001", "chat_id": CHAT, "title": "x"}, 400, "title: unknown field"),
    ({"profile": "profile-\ud800", "chat_id": CHAT}, 400, "profile: contains a lone surrogate"),
    ([], 400, "body: must be a JSON object"),
])
async def test_a_bad_conversation_request_names_the_field(
        page: Page, body: Any, status: int, error: str) -> None:
    raw = json.dumps(body)  # ensure_ascii: a lone surrogate travels as its escape
    async with page.http.post(f"{page.base}/api/conversations", data=raw,
                              headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == status
        assert (await resp.json())["error"].startswith(error)
    async with page.http.post(f"{page.base}/api/conversations", data=raw) as resp:
        assert resp.status == 415  # not JSON: no form posted by another site
    async with page.http.get(f"{page.base}/api/conversations",
                             params={"profile": "x"}) as resp:
        assert resp.status == 400 and (await resp.json())["error"].startswith("profile:")


async def test_a_conversation_body_that_never_arrives_is_408(
        store: Store, tmp_path: Path) -> None:
    channel = await bare_channel(store, tmp_path, body_timeout="0.05s")
    try:
        assert channel.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", channel.port)
        writer.write(b"POST /api/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"profile\": ")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
    finally:
        await channel.stop()
    assert head.startswith(b"HTTP/1.1 408")
