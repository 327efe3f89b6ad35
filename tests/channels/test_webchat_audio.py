"""WebChat recordings (the page's microphone button): uploaded over the socket, saved in the
chat's inbox folder, transcribed before the turn like any voice note."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.app import Gateway
from tests.channels.webchat_page import CHAT, PNG, Page, channel_of, is_type
from tests.conftest import MakeConfig
from tests.fakes.audio_server import ScriptedAudio
from tests.fakes.openai_server import ScriptedLLM

WEBM = b"\x1a\x45\xdf\xa3" + b"\x9f\x42\x86\x81\x01 fake opus recording"


@pytest.fixture
async def audio() -> AsyncIterator[ScriptedAudio]:
    async with ScriptedAudio() as server:
        yield server


@pytest.fixture
async def gateway(make_config: MakeConfig, audio: ScriptedAudio) -> AsyncIterator[Gateway]:
    config = make_config(
        channels={"webchat": {"enabled": True, "port": 0, "max_audio_bytes": 1024}},
        agent={"media": {"transcription": {"api_base": audio.base_url, "model": "whisper-1"}}})
    async with Gateway(config, grace=2.0) as gw:
        yield gw


def recording(data: bytes = WEBM, mime: str = "audio/webm;codecs=opus") -> dict[str, str]:
    return {"data_base64": base64.b64encode(data).decode(), "mime": mime}


async def test_a_recording_is_transcribed_and_kept(gateway: Gateway, llm: ScriptedLLM,
                                                   audio: ScriptedAudio) -> None:
    audio.hears("book a table for two", seconds=1.2)
    llm.reply("Done: a table for two.")
    async with aiohttp.ClientSession() as http:
        page = Page(http, str(channel_of(gateway).base_url))
        conn = await page.connect()
        await conn.message("", audio=recording())
        assert (await conn.reply())["text"] == "Done: a table for two."
        [heard] = audio.transcriptions
        assert heard.file == WEBM and heard.content_type == "audio/webm"
        text = llm.last_request["messages"][-1]["content"]
        assert "[transcript of this recording, 1 s] book a table for two" in text
        [sent, _] = (await page.history())["messages"]
        assert sent["image"] is None and sent["audio"]["mime"] == "audio/webm"
        name = sent["audio"]["name"]
        stored = gateway.config.workspace_path / "inbox" / "webchat" / CHAT / name
        assert stored.read_bytes() == WEBM and f"[attached audio: {stored} " in text
        async with http.get(f"{page.base}/api/media/{name}", params={"chat_id": CHAT}) as resp:
            assert resp.status == 200 and resp.content_type == "audio/webm"
            assert await resp.read() == WEBM


@pytest.mark.parametrize(("audio_value", "expected"), [
    (recording(mime="audio/flac"), "audio.mime: must be one of audio/webm"),
    (recording(b"<html>not audio</html>"), "audio.data_base64: not a audio/webm audio"),
    (recording(WEBM * 60), "audio: larger than the 1 KB limit"),
    ("a string", "audio: must be an object with data_base64 and mime"),
])
async def test_bad_recordings_are_refused_naming_the_field(
        gateway: Gateway, llm: ScriptedLLM, audio_value: object, expected: str) -> None:
    async with aiohttp.ClientSession() as http:
        page = Page(http, str(channel_of(gateway).base_url))
        conn = await page.connect()
        await conn.message("", audio=audio_value)
        error = await conn.until(is_type("error"))
        assert error["error"].startswith(expected), error
        await conn.message("x", "msg-00000002", audio=recording(),
                           image={"data_base64": base64.b64encode(PNG).decode(),
                                  "mime": "image/png"})
        error = await conn.until(is_type("error"))
        assert error["error"] == "audio: a recording is sent on its own, without an image"
    assert llm.calls == 0


async def test_images_saved_by_earlier_versions_are_still_served(gateway: Gateway) -> None:
    """Before the inbox, uploads lived in data_dir/media/webchat/: their history still
    shows them, to their own chat only."""
    name = "0123456789abcdef0123456789abcdef.png"
    earlier = gateway.config.data_path / "media" / "webchat"
    earlier.mkdir(parents=True)
    (earlier / name).write_bytes(PNG)
    channel = channel_of(gateway)
    await channel._log.add(chat_id=CHAT, role="user", kind="user", text="old one",
                           key="in:old", image={"name": name, "mime": "image/png",
                                                "size": len(PNG)}, message_id="msg-old00001")
    async with aiohttp.ClientSession() as http:
        page = Page(http, str(channel.base_url))
        url = f"{page.base}/api/media/{name}"
        async with http.get(url, params={"chat_id": CHAT}) as resp:
            assert resp.status == 200 and await resp.read() == PNG
        async with http.get(url, params={"chat_id": "another-chat-0001"}) as resp:
            assert resp.status == 404
