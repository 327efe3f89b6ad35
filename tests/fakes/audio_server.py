"""A scripted OpenAI-compatible audio server on loopback: ``/audio/transcriptions`` (speech to
text, multipart like OpenAI's, Groq's or a local whisper server's) and ``/audio/speech`` (text
to speech).

Tests script what it answers (``hears("hello")``, ``fails(503)``), then read what arrived
(``transcriptions``: the form's fields and the file's bytes; ``speech``: the JSON bodies).
``wait_for(n)`` is the event a test waits for; nothing waits on the wall clock.

    async with ScriptedAudio() as audio:
        audio.hears("turn the lights off", seconds=2.5)
        ...  # config: agent.media.transcription: {api_base: audio.base_url, model: whisper-1}
        [got] = audio.transcriptions
        assert got.file == voice_bytes
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiohttp import web

SPEECH_BYTES = b"OggS fake opus voice"


@dataclass(frozen=True, slots=True)
class Heard:
    fields: dict[str, str]
    filename: str | None
    content_type: str | None
    file: bytes
    authorization: str | None


class ScriptedAudio:
    def __init__(self, *, formats: tuple[str, ...] = ("json", "verbose_json", "text")) -> None:
        """``formats``: the ``response_format`` values it knows (others get HTTP 400, as
        OpenAI's newer models answer ``verbose_json``)."""
        self.formats = formats
        self._answers: deque[tuple[int, str, float | None]] = deque()
        self.transcriptions: list[Heard] = []
        self.speech: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        app.router.add_post("/v1/audio/speech", self._speak)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def hears(self, text: str, *, seconds: float | None = None) -> Self:
        self._answers.append((200, text, seconds))
        return self

    def fails(self, status: int = 503, message: str = "model overloaded") -> Self:
        self._answers.append((status, message, None))
        return self

    async def wait_for(self, n: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Until ``n`` transcription or speech requests arrived (``timeout``: a safety cap)."""
        async def arrived() -> None:
            while len(self.transcriptions) + len(self.speech) < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(arrived(), timeout)

    async def _transcribe(self, request: web.Request) -> web.Response:
        fields: dict[str, str] = {}
        file, filename, content_type = b"", None, None
        async for part in await request.multipart():
            if part.name == "file":
                filename, content_type = part.filename, part.headers.get("Content-Type")
                file = bytes(await part.read())  # type: ignore[union-attr]
            elif part.name:
                fields[part.name] = await part.text()  # type: ignore[union-attr]
        self.transcriptions.append(Heard(fields, filename, content_type, file,
                                         request.headers.get("Authorization")))
        self._changed.set()
        wanted = fields.get("response_format", "json")
        if wanted not in self.formats:
            return web.json_response({"error": {
                "message": f"response_format '{wanted}' is not compatible with this model",
                "param": "response_format"}}, status=400)
        status, text, seconds = self._answers.popleft() if self._answers else \
            (500, "ScriptedAudio: nothing scripted", None)
        if status != 200:
            return web.json_response({"error": {"message": text}}, status=status)
        body: dict[str, Any] = {"text": text}
        if fields.get("response_format") == "verbose_json" and seconds is not None:
            body.update(duration=seconds, language="en", segments=[])
        return web.json_response(body)

    async def _speak(self, request: web.Request) -> web.Response:
        self.speech.append(await request.json())
        self._changed.set()
        return web.Response(body=SPEECH_BYTES, content_type="audio/ogg")
