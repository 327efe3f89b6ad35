"""Who may reach WebChat: the socket's ``Origin``, loopback ``Host`` names without a token,
the token on every route but the page (never logged), and the refusal to listen beyond
loopback without one.

Split from ``test_webchat.py``; the page helpers and the gateway fixtures are in
``webchat_page.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import aiohttp
import pytest

from channels.webchat import CLOSE_UNAUTHORIZED, WebchatChannel, WebchatError
from channels.webchat_frames import host_allowed, origin_allowed
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import ConfigError, WebchatChannelConfig, parse_config
from gateway.kernel.store import Store
from tests.channels.webchat_page import (
    CHAT,
    TOKEN,
    Page,
    bare_channel,
)


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
    channel = WebchatChannel(config, MessageBus(), store, workspace=tmp_path)
    with pytest.raises(WebchatError, match="channels.webchat.token"):
        await channel.start()
    assert not channel.status().running


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
