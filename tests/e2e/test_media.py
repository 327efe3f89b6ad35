"""Voice, images and documents understood before the turn, through the real channels:
python-telegram-bot against the fake Bot API, discord.py against the fake Discord, a scripted
transcription server and a scripted vision model on loopback; nothing of ours is mocked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import Gateway
from gateway.kernel.config import Config
from tests.agent.media.pdfs import text_pdf
from tests.conftest import MakeConfig
from tests.e2e.test_cli import _env, parley
from tests.e2e.test_discord import ADA_ID as DC_ADA
from tests.e2e.test_discord import BOB_ID as DC_BOB
from tests.e2e.test_discord import discord_config
from tests.e2e.test_telegram import ADA_ID, telegram_config
from tests.fakes.audio_server import SPEECH_BYTES, ScriptedAudio
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.telegram_server import FakeTelegram

VOICE = b"OggS fake opus voice note"
PNG = b"\x89PNG\r\n\x1a\n fake picture of a red bicycle"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def audio() -> AsyncIterator[ScriptedAudio]:
    async with ScriptedAudio() as server:
        yield server


def with_media(make_config: MakeConfig, **media: Any) -> MakeConfig:
    """``make_config`` that sets ``agent.media`` too."""
    def make(**overrides: Any) -> Config:
        return make_config(**{**overrides, "agent": {**overrides.get("agent", {}),
                                                     "media": media}})
    return make


def transcription(audio: ScriptedAudio, **extra: Any) -> dict[str, Any]:
    return {"transcription": {"api_base": audio.base_url, "model": "whisper-1",
                              "api_key": "sk-whisper-secret", **extra}}


def user_text(request: dict[str, Any]) -> str:
    content = request["messages"][-1]["content"]
    return content if isinstance(content, str) else content[0]["text"]


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def read_the_file_then(answer: str) -> Callable[[dict[str, Any]], Any]:
    """A model that opens the recording's path with read_file, then answers."""
    def respond(body: dict[str, Any]) -> Any:
        if tool_results(body):
            return answer
        path = inbox_path(user_text(body))
        return {"tool_calls": [{"function": {"name": "read_file", "arguments": {"path": path}}}]}
    return respond


def inbox_path(text: str) -> str:
    """The path in the ``[attached audio: <path> (...)]`` note."""
    return text.split("[attached audio: ")[1].split(" (")[0]


async def test_telegram_voice_note_is_transcribed_and_its_file_readable(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM,
        audio: ScriptedAudio) -> None:
    config = telegram_config(with_media(make_config, **transcription(audio, echo=True)), tg)
    audio.hears("remind me to water the plants", seconds=2.0)
    ada = tg.user(ADA_ID, "Ada")
    async with Gateway(config, grace=2.0) as gw:
        llm.respond_with(read_the_file_then("Sure, I'll remind you."))
        tg.voice(tg.private(ada), ada, VOICE)
        echo, answer = await tg.wait_sent(ADA_ID, 2)
        assert gw.store is not None
        kinds = {r.key: r.calls for r in await gw.store.usage_by("kind")}
    assert kinds == {"transcription": 1, "chat": 2}  # the step's cost beside the model's
    path = gw.config.data_path.parent / "cli.yaml"
    path.write_text(yaml.safe_dump({"workspace": str(gw.config.workspace_path),
                                    "data_dir": str(gw.config.data_path),
                                    "agent": {"model": "openai/test-model"}}))
    code, out, err = await parley("usage", "--config", str(path), "--by", "kind", env=_env())
    assert code == 0, err
    assert "transcription" in out and "chat" in out
    [heard] = audio.transcriptions
    assert heard.file == VOICE and heard.fields["model"] == "whisper-1"
    assert heard.authorization == "Bearer sk-whisper-secret"
    assert echo.text == "🎤 “remind me to water the plants”"
    assert answer.text == "Sure, I'll remind you."
    first = llm.requests[0]
    text = user_text(first)
    assert "[transcript of this recording, 2 s] remind me to water the plants" in text
    path = Path(inbox_path(text))
    workspace = gw.config.workspace_path.resolve()
    assert path.is_relative_to(workspace / "inbox" / "telegram" / str(ADA_ID))
    assert tool_results(llm.requests[1]) and VOICE.decode() in tool_results(llm.requests[1])[0]
    usage = [json.dumps(r) for r in llm.requests]
    assert not any("sk-whisper-secret" in u for u in usage)


async def test_failing_transcription_is_told_in_one_line_and_the_turn_answers(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM,
        audio: ScriptedAudio) -> None:
    config = telegram_config(with_media(make_config, **transcription(audio)), tg)
    audio.fails(503, "model overloaded")
    llm.reply("I could not hear it, sorry; could you type it?")
    ada = tg.user(ADA_ID, "Ada")
    async with Gateway(config, grace=2.0):
        tg.voice(tg.private(ada), ada, VOICE)
        notice, answer = await tg.wait_sent(ADA_ID, 2)
    assert notice.text.startswith("(I couldn't transcribe your audio: the transcription "
                                  "server answered HTTP 503")
    assert "\n" not in notice.text and "Traceback" not in notice.text
    assert answer.text == "I could not hear it, sorry; could you type it?"
    text = user_text(llm.last_request)
    assert "[not transcribed: the transcription server answered HTTP 503" in text
    assert Path(inbox_path(text)).read_bytes() == VOICE


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5) as server:
        yield server


async def test_discord_voice_message_from_a_member(make_config: MakeConfig, dc: FakeDiscord,
                                                   llm: ScriptedLLM,
                                                   audio: ScriptedAudio) -> None:
    """A member (not the owner) sends a voice message; its file in the chat's inbox folder is
    theirs to read, and the answer comes spoken too."""
    speech = {"api_base": audio.base_url, "model": "tts-1"}
    config = discord_config(with_media(make_config, **transcription(audio), speech=speech), dc,
                            members=[str(DC_BOB)])
    dc.user(DC_ADA, "ada", global_name="Ada")
    bob = dc.user(DC_BOB, "bob", global_name="Bob")
    audio.hears("what's the weather in Lisbon?", seconds=1.5)
    llm.respond_with(read_the_file_then("Sunny."))
    async with Gateway(config, grace=2.0) as gw:
        dm = dc.dm_channel(bob)
        dc.post(dm, bob, "", attachments=(("voice-message.ogg", VOICE, "audio/ogg"),))
        answer, spoken = await dc.wait_sent(dm["id"], 2)
    assert answer.content == "Sunny."
    [(name, data)] = spoken.files  # the voice reply, as an attachment
    assert data == SPEECH_BYTES and name.startswith("reply-") and name.endswith(".ogg")
    [heard] = audio.transcriptions
    assert heard.file == VOICE and heard.filename and heard.filename.endswith(".ogg")
    text = user_text(llm.requests[0])
    assert "Sender trust: member" in json.dumps(llm.requests[0])
    assert "what's the weather in Lisbon?" in text
    path = Path(inbox_path(text))
    assert path.is_relative_to(gw.config.workspace_path.resolve() / "inbox" / "discord"
                               / str(dm["id"]))
    [result] = tool_results(llm.requests[1])
    assert VOICE.decode() in result and "private" not in result


async def test_text_only_model_gets_the_description_never_the_image(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    async with ScriptedLLM(models=("vision-model",)) as vision:
        config = telegram_config(with_media(make_config, vision={
            "main_sees_images": False, "model": "openai/vision-model",
            "api_base": vision.base_url, "api_key": "sk-vision"}), tg)
        vision.reply("A red bicycle leaning on a wall; a sign reads 'NO PARKING'.")
        llm.reply("That's a red bicycle by a no-parking sign.")
        ada = tg.user(ADA_ID, "Ada")
        async with Gateway(config, grace=2.0):
            tg.photo(tg.private(ada), ada, PNG, "what is this?")
            [answer] = await tg.wait_sent(ADA_ID)
        vision.assert_all_used()
        [asked] = vision.requests
        parts = asked["messages"][0]["content"]
        assert parts[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert answer.text == "That's a red bicycle by a no-parking sign."
    sent = json.dumps(llm.requests)
    assert "image_url" not in sent and "base64" not in sent
    text = user_text(llm.last_request)
    assert "what is this?" in text and "NO PARKING" in text
    assert "[attached image: " in text and "/inbox/telegram/" in text


async def test_a_40_page_pdf_becomes_a_bounded_excerpt_and_a_path(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    pdf = text_pdf([f"Page {n}: " + "lorem ipsum dolor sit amet " * 20 for n in range(1, 41)])
    config = telegram_config(with_media(make_config, documents={"max_tokens": 500}), tg)
    llm.reply("It's a long lorem ipsum.")
    ada = tg.user(ADA_ID, "Ada")
    async with Gateway(config, grace=2.0):
        tg.document(tg.private(ada), ada, pdf, "report.pdf", "application/pdf", "summarise")
        await tg.wait_sent(ADA_ID)
    text = user_text(llm.last_request)
    assert "Page 1:" in text and "Page 40:" not in text
    assert "[PDF, 40 pages: only its beginning follows (2,000 characters); the text stops " \
           "in page 4 of 40" in text
    assert "read_file reads the rest" in text
    path = Path(text.split("[attached file: ")[1].split(" (")[0])
    assert path.read_bytes() == pdf and path.name == "report.pdf"
    assert len(text) < 2000 + 1000


async def test_a_voice_note_is_answered_with_a_voice_note(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM,
        audio: ScriptedAudio) -> None:
    speech = {"api_base": audio.base_url, "model": "tts-1", "voice": "nova",
              "api_key": "sk-speech-secret"}
    config = telegram_config(with_media(make_config, **transcription(audio), speech=speech), tg)
    audio.hears("how long do eggs boil?")
    llm.reply("About **seven** minutes for a firm yolk.")
    ada = tg.user(ADA_ID, "Ada")
    async with Gateway(config, grace=2.0) as gw:
        tg.voice(tg.private(ada), ada, VOICE)
        text, voice = await tg.wait_sent(ADA_ID, 2)
        assert gw.store is not None
        kinds = {r.key for r in await gw.store.usage_by("kind")}
        history = await gw.store.active_session(f"telegram:{ADA_ID}")
    assert text.text == "About seven minutes for a firm yolk."
    assert voice.method == "sendVoice" and voice.data == SPEECH_BYTES
    [spoken] = audio.speech
    assert spoken == {"model": "tts-1", "input": "About **seven** minutes for a firm yolk.",
                      "voice": "nova", "response_format": "opus"}
    assert kinds == {"chat", "transcription", "speech"}
    assert history.message_count == 2  # the text answer is the history's


async def test_a_typed_message_is_answered_in_text_only(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM,
        audio: ScriptedAudio) -> None:
    speech = {"api_base": audio.base_url, "model": "tts-1"}
    config = telegram_config(with_media(make_config, speech=speech), tg)
    llm.reply("Seven minutes.")
    ada = tg.user(ADA_ID, "Ada")
    async with Gateway(config, grace=2.0):
        tg.dm(ada, "how long do eggs boil?")
        [answer] = await tg.wait_sent(ADA_ID)
    assert answer.text == "Seven minutes." and audio.speech == []
