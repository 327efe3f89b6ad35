"""Voice and audio to text, before the turn (``agent.media.transcription``).

Two ways, one result: any OpenAI-compatible ``POST {api_base}/audio/transcriptions``
(OpenAI, Groq, a local faster-whisper or whisper.cpp server), posted here with aiohttp as
multipart; or, without ``api_base``, a litellm provider (``litellm.atranscription``). The
endpoint is the operator's own configuration, not something the agent chooses, so it is not
routed through the SSRF guard; its key never appears in a log line or an error.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from agent.media.endpoint import EndpointFailed, post, short
from agent.provider import bundled_model_info, litellm_module
from gateway.kernel.config_media import TranscriptionConfig
from gateway.kernel.frozen import frozen


class TranscriptionFailed(Exception):
    """Why a recording could not be transcribed, in words fit for the chat (no secrets)."""


@frozen
class Transcript:
    text: str
    seconds: float | None
    """The recording's length, when the server said it."""
    latency_ms: float
    cost: float


class Transcriber:
    def __init__(self, config: TranscriptionConfig) -> None:
        assert config.model is not None
        self.config = config
        self.model = config.model
        info = bundled_model_info(self.model) or {}
        self._per_second = float(info.get("input_cost_per_second") or 0.0)

    async def transcribe(self, path: Path, mime: str | None) -> Transcript:
        started = time.monotonic()
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise TranscriptionFailed(f"the file could not be read ({exc.strerror})") from None
        if self.config.api_base:
            text, seconds = await self._post(path.name, data, mime)
        else:
            text, seconds = await self._litellm(path.name, data)
        return Transcript(text.strip(), seconds, (time.monotonic() - started) * 1000,
                          (seconds or 0.0) * self._per_second)

    async def _post(self, name: str, data: bytes, mime: str | None) -> tuple[str, float | None]:
        """The OpenAI-compatible endpoint; ``verbose_json`` for the duration, plain ``json``
        once more when the server does not know that format."""
        try:
            return await self._post_as(name, data, mime, "verbose_json")
        except _FormatRefused:
            return await self._post_as(name, data, mime, "json")

    async def _post_as(self, name: str, data: bytes, mime: str | None,
                       response_format: str) -> tuple[str, float | None]:
        config = self.config
        assert config.api_base is not None
        form = aiohttp.FormData()
        form.add_field("file", data, filename=name, content_type=mime or "application/octet-stream")
        form.add_field("model", self.model)
        form.add_field("response_format", response_format)
        for field, value in (("language", config.language), ("prompt", config.prompt)):
            if value:
                form.add_field(field, value)
        try:
            status, raw = await post(config.api_base, "/audio/transcriptions",
                                     api_key=config.api_key, within=config.timeout,
                                     what="transcription", data=form)
        except EndpointFailed as exc:
            raise TranscriptionFailed(str(exc)) from None
        body = raw.decode("utf-8", "replace")
        if status == 400 and response_format != "json" and "response_format" in body:
            raise _FormatRefused
        if status != 200:
            raise TranscriptionFailed(f"the transcription server answered HTTP {status}"
                                      + (f": {short(body)}" if body.strip() else ""))
        return _parse(body)

    async def _litellm(self, name: str, data: bytes) -> tuple[str, float | None]:
        config = self.config
        kwargs: dict[str, Any] = {"model": self.model, "file": (name, data),
                                  "timeout": config.timeout}
        for field, value in (("api_key", config.api_key), ("language", config.language),
                             ("prompt", config.prompt)):
            if value:
                kwargs[field] = value
        try:
            response = await litellm_module().atranscription(**kwargs)
        except Exception as exc:  # litellm maps every provider error to its own classes
            raise TranscriptionFailed(short(str(exc)) or type(exc).__name__) from None
        seconds = getattr(response, "duration", None)
        return str(getattr(response, "text", "") or ""), \
            float(seconds) if isinstance(seconds, int | float) else None


class _FormatRefused(Exception):
    pass


def _parse(body: str) -> tuple[str, float | None]:
    try:
        data = json.loads(body)
    except ValueError:
        return body, None  # response_format text, from a server that ignores the ask
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise TranscriptionFailed("the transcription server's answer had no text")
    seconds = data.get("duration")
    return data["text"], float(seconds) if isinstance(seconds, int | float) else None

