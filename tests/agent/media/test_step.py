"""The media step's own rules: a document that cannot be read in time is given up with one
notice, the turn's message keeps its path; a message without files is left alone."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import agent.media as media_step
from agent.media import MediaStep
from agent.provider import Provider
from agent.usage import Prices
from gateway.kernel.config import AgentConfig
from gateway.kernel.events import InboundMessage, Media
from tests.agent.media.pdfs import text_pdf


def step(tmp_path: Path) -> MediaStep:
    config = AgentConfig(model="openai/test-model", api_base="http://127.0.0.1:9/v1")
    return MediaStep(config, Provider(config), Prices(config.usage), workspace=tmp_path)


def message(*media: Media) -> InboundMessage:
    return InboundMessage(channel="local", chat_id="c1", sender_id="u", text="look",
                          media=media, received_at=datetime(2026, 1, 1, tzinfo=UTC))


async def test_a_document_read_too_slowly_is_given_up(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "slow.pdf"
    path.write_bytes(text_pdf(["a page"]))
    stuck = threading.Event()

    def never_done(*args: Any) -> None:
        stuck.wait(30)

    monkeypatch.setattr(media_step, "read_document", never_done)
    monkeypatch.setattr(media_step, "READ_SECONDS", 0)
    try:
        done = await step(tmp_path).understand(
            message(Media(kind="file", path=str(path), mime="application/pdf")), None)
    finally:
        stuck.set()
    assert done.notices == ["(I couldn't read slow.pdf: reading it took longer than 0 s.)"]
    [kept] = done.msg.media
    assert kept.path == str(path) and kept.text == "[not read: reading it took longer than 0 s]"
    assert done.calls == []


async def test_files_of_no_known_kind_and_messages_without_files(tmp_path: Path) -> None:
    media = step(tmp_path)
    assert not media.wanted(message())
    video = Media(kind="video", path=str(tmp_path / "clip.mp4"), mime="video/mp4")
    done = await media.understand(message(video), None)
    assert done.msg.media == (video,) and done.notices == [] and done.calls == []
