"""Voice replies (``agent.media.speech``): a voice note is answered with a voice note, spoken
by an OpenAI-compatible ``POST {api_base}/audio/speech`` (OpenAI ``tts-1``, a local Kokoro or
Piper server). The reply's text stays in the history and is sent as well; when speaking fails
the text alone goes out. Like transcription, the endpoint is the operator's configuration; its
key never reaches a log line.
"""

from __future__ import annotations

import time

from agent.media.endpoint import EndpointFailed, post, short
from gateway.kernel.config_media import SpeechConfig
from gateway.kernel.events import InboundMessage
from gateway.kernel.frozen import frozen

SUFFIXES = {"opus": (".ogg", "audio/ogg"), "mp3": (".mp3", "audio/mpeg"),
            "wav": (".wav", "audio/wav")}


class SpeechFailed(Exception):
    pass


@frozen
class Spoken:
    data: bytes
    suffix: str
    mime: str
    latency_ms: float


def answers_in_voice(config: SpeechConfig, msg: InboundMessage, text: str) -> bool:
    """A voice note (or any recording) was sent, speech is configured and the answer is
    short enough to listen to."""
    return bool(config.model and config.api_base and text.strip()
                and len(text) <= config.max_chars and msg.channel in config.channels
                and any(m.kind == "audio" for m in msg.media))


async def speak(config: SpeechConfig, text: str) -> Spoken:
    assert config.api_base is not None and config.model is not None
    started = time.monotonic()
    body = {"model": config.model, "input": text, "voice": config.voice,
            "response_format": config.format}
    try:
        status, data = await post(config.api_base, "/audio/speech", api_key=config.api_key,
                                  within=config.timeout, what="speech", json=body)
    except EndpointFailed as exc:
        raise SpeechFailed(str(exc)) from None
    if status != 200:
        raise SpeechFailed(f"HTTP {status}: {short(data.decode('utf-8', 'replace'))}")
    if not data:
        raise SpeechFailed("the speech server sent no audio")
    suffix, mime = SUFFIXES[config.format]
    return Spoken(data, suffix, mime, (time.monotonic() - started) * 1000)
