"""Transcription against the scripted audio server: the direct OpenAI-compatible route and
litellm's, and the answers a server may give."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.media.transcribe import Transcriber, TranscriptionFailed
from agent.media.vision import sees_images
from gateway.kernel.config_media import TranscriptionConfig, VisionConfig
from tests.fakes.audio_server import ScriptedAudio

VOICE = b"OggS a short recording"


@pytest.fixture
async def audio() -> AsyncIterator[ScriptedAudio]:
    async with ScriptedAudio(formats=("json",)) as server:
        yield server


@pytest.fixture
def voice(tmp_path: Path) -> Path:
    path = tmp_path / "note.ogg"
    path.write_bytes(VOICE)
    return path


async def test_a_server_without_verbose_json_is_asked_again_plainly(
        audio: ScriptedAudio, voice: Path) -> None:
    audio.hears("hello there")
    config = TranscriptionConfig(api_base=audio.base_url, model="whisper-large-v3",
                                 language="en", prompt="Parley")
    heard = await Transcriber(config).transcribe(voice, "audio/ogg")
    assert (heard.text, heard.seconds) == ("hello there", None)
    first, second = audio.transcriptions
    assert first.fields["response_format"] == "verbose_json"
    assert second.fields == {"model": "whisper-large-v3", "response_format": "json",
                             "language": "en", "prompt": "Parley"}
    assert second.file == VOICE and second.authorization is None


async def test_litellm_route(voice: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without api_base the model is litellm's (here its openai provider, pointed at the
    scripted server by the provider's own environment variable)."""
    async with ScriptedAudio() as audio:
        monkeypatch.setenv("OPENAI_BASE_URL", audio.base_url)
        audio.hears("through litellm", seconds=3.0)
        config = TranscriptionConfig(model="openai/whisper-1", api_key="sk-test-whisper")
        heard = await Transcriber(config).transcribe(voice, "audio/ogg")
    assert (heard.text, heard.seconds) == ("through litellm", 3.0)
    assert heard.cost == pytest.approx(3.0 * 0.0001)  # whisper-1's price a second, litellm's
    [got] = audio.transcriptions
    assert got.file == VOICE and got.fields["model"] == "whisper-1"
    assert got.authorization == "Bearer sk-test-whisper"


async def test_failures_are_one_line_without_the_key(audio: ScriptedAudio, voice: Path,
                                                     tmp_path: Path) -> None:
    config = TranscriptionConfig(api_base=audio.base_url, model="whisper-1",
                                 api_key="sk-never-shown-123")
    audio.fails(401, "invalid key sk-never-shown-123")
    with pytest.raises(TranscriptionFailed) as failed:
        await Transcriber(config).transcribe(voice, "audio/ogg")
    assert str(failed.value).startswith("the transcription server answered HTTP 401")
    with pytest.raises(TranscriptionFailed, match="could not be read"):
        await Transcriber(config).transcribe(tmp_path / "gone.ogg", "audio/ogg")
    closed = TranscriptionConfig(api_base="http://127.0.0.1:9/v1", model="whisper-1")
    with pytest.raises(TranscriptionFailed, match="could not be reached"):
        await Transcriber(closed).transcribe(voice, "audio/ogg")


def test_which_models_see_images() -> None:
    auto = VisionConfig()
    assert sees_images(auto, "openai/gpt-4o-mini")
    assert not sees_images(auto, "gpt-3.5-turbo")  # litellm knows it: text only
    assert sees_images(auto, "openai/my-local-model")  # unknown: as before, images go
    assert not sees_images(VisionConfig(main_sees_images=False), "openai/gpt-4o-mini")
