"""The pre-turn media step: what people send is understood before the context is built.

For each file of the turn's message (saved in the workspace's ``inbox/<channel>/<chat>/`` by
its channel) the step puts what it read into ``Media.text``, which the context shows the model
after the file's path (``agent/context.py``), so the path is always kept:

- audio (voice notes, audio files, WebChat recordings) → a transcript (``transcribe.py``);
- an image, when the turn's model does not see images → a description by the auxiliary
  vision model (``vision.py``), and the image itself is not sent;
- a PDF, DOCX, text or Markdown document → its head within a token budget (``documents.py``).

After the turn, a voice note's answer can be spoken (``speech.py``, ``voice_reply``).

A step that fails says so in one line in the chat (and to the model, beside the path); the
turn runs all the same. What each step cost (time, tokens, seconds of audio) goes to the usage
ledger beside the model calls, as its own ``kind``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.media.documents import Unreadable, document_type, read_document
from agent.media.speech import SpeechFailed, answers_in_voice, speak
from agent.media.transcribe import Transcriber, TranscriptionFailed
from agent.media.vision import DescribeFailed, Describer, sees_images
from agent.provider import Provider
from agent.usage import Prices
from gateway.kernel.config import AgentConfig
from gateway.kernel.events import InboundMessage, Media
from gateway.kernel.inbox_files import inbox_path, save_file
from gateway.kernel.store import LLMCallRecord

_log = logging.getLogger(__name__)

__all__ = ["MediaStep", "Understood"]

READ_SECONDS = 30.0
"""A document not read by then (a hostile PDF that sends the parser round in circles) is given
up; the turn goes on with its path. The thread finishes on its own."""


@dataclass(slots=True)
class Understood:
    msg: InboundMessage
    """The message with what was read of its files (``Media.text``)."""
    notices: list[str] = field(default_factory=list)
    """Lines for the chat: an echoed transcript, a step that failed."""
    calls: list[LLMCallRecord] = field(default_factory=list)
    """What the steps cost, for the usage ledger."""


class MediaStep:
    def __init__(self, config: AgentConfig, provider: Provider, prices: Prices, *,
                 workspace: Path) -> None:
        """``workspace``: spoken replies are saved in the chat's inbox folder there."""
        self.config = config.media
        self.workspace = workspace
        self.provider = provider
        self.prices = prices
        media = config.media
        self.transcriber = Transcriber(media.transcription) \
            if media.transcription.model else None
        self.describer = Describer(media.vision, config) if media.vision.model else None

    def wanted(self, msg: InboundMessage) -> bool:
        """Whether ``msg`` has a file a step may read (cheap: no I/O)."""
        return any(m.path and m.text is None for m in msg.media)

    async def understand(self, msg: InboundMessage, alias: str | None) -> Understood:
        """``msg`` with what each step read of its files; ``alias``: the turn's model."""
        done = Understood(msg)
        model = self.provider.chains.get(alias, self.provider.targets)[0].model
        media = [await self._one(m, done, model) for m in msg.media]
        done.msg = replace(msg, media=tuple(media))
        return done

    def speaks(self, msg: InboundMessage, text: str) -> bool:
        return answers_in_voice(self.config.speech, msg, text)

    async def voice_reply(self, msg: InboundMessage, text: str,
                          turn_id: str) -> tuple[Media | None, list[LLMCallRecord]]:
        """The answer to a voice note, spoken and saved beside it; None when speaking failed
        (the text still goes out)."""
        config = self.config.speech
        try:
            spoken = await speak(config, text)
        except SpeechFailed as exc:
            _log.warning("voice reply failed, answering in text: %s", exc)
            return None, []
        path = await asyncio.to_thread(
            save_file, inbox_path(self.workspace, msg.channel, msg.chat_id),
            f"reply-{turn_id[:12]}{spoken.suffix}", spoken.data)
        call = LLMCallRecord(config.model or "", 0, 0, spoken.latency_ms, 1, kind="speech")
        return Media(kind="audio", path=str(path), mime=spoken.mime, size=len(spoken.data)), \
            [call]

    async def aclose(self) -> None:
        if self.describer is not None:
            await self.describer.aclose()

    async def _one(self, media: Media, done: Understood, model: str) -> Media:
        if media.text is not None or media.path is None:
            return media
        path = Path(media.path)
        if media.kind == "audio" and self.transcriber is not None:
            return await self._transcribe(media, path, done)
        if media.kind == "image" and not sees_images(self.config.vision, model):
            return await self._describe(media, path, done, model)
        kind = document_type(media.path, media.mime) if media.kind == "file" else None
        if kind is not None and self.config.documents.enabled:
            return await self._read(media, path, kind, done)
        return media

    async def _transcribe(self, media: Media, path: Path, done: Understood) -> Media:
        assert self.transcriber is not None
        try:
            heard = await self.transcriber.transcribe(path, media.mime)
        except TranscriptionFailed as exc:
            _log.warning("transcription of %s failed: %s", path.name, exc)
            done.notices.append(f"(I couldn't transcribe your audio: {exc}. I'll answer "
                                "without knowing what it says.)")
            return replace(media, text=f"[not transcribed: {exc}]")
        done.calls.append(LLMCallRecord(
            self.transcriber.model, 0, 0, heard.latency_ms, 1, heard.cost,
            kind="transcription", audio_seconds=heard.seconds))
        if self.config.transcription.echo and heard.text:
            done.notices.append(f"🎤 “{heard.text}”")
        length = f", {heard.seconds:.0f} s" if heard.seconds else ""
        return replace(media, text=f"[transcript of this recording{length}] "
                                   f"{heard.text or '(no speech heard)'}")

    async def _describe(self, media: Media, path: Path, done: Understood, model: str) -> Media:
        if self.describer is None:
            return replace(media, text=f"[{model} does not see images and no vision model "
                                       "is configured (agent.media.vision.model): only this "
                                       "image's path is known]")
        try:
            response = await self.describer.describe(path, media.mime)
        except DescribeFailed as exc:
            _log.warning("description of %s failed: %s", path.name, exc)
            done.notices.append(f"(I couldn't look at your image: {exc}.)")
            return replace(media, text=f"[not described: {exc}]")
        done.calls.append(LLMCallRecord(
            response.target or response.model, response.prompt_tokens,
            response.completion_tokens, response.latency_ms, response.attempts,
            self.prices.cost(response), kind="vision"))
        return replace(media, text="[what the image shows, as described by "
                                   f"{response.target or response.model}] "
                                   f"{(response.content or '').strip()}")

    async def _read(self, media: Media, path: Path, kind: str, done: Understood) -> Media:
        started = time.monotonic()
        try:
            excerpt = await asyncio.wait_for(
                asyncio.to_thread(read_document, path, kind, self.config.documents),
                READ_SECONDS)
        except (Unreadable, TimeoutError) as exc:
            why = str(exc) if isinstance(exc, Unreadable) else \
                f"reading it took longer than {READ_SECONDS:g} s"
            done.notices.append(f"(I couldn't read {path.name}: {why}.)")
            return replace(media, text=f"[not read: {why}]")
        done.calls.append(LLMCallRecord(kind, 0, 0, (time.monotonic() - started) * 1000, 1,
                                        kind="document"))
        return replace(media, text=excerpt.text)
