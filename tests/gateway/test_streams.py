"""The kernel's reply stream (``gateway/kernel/streams.py``): what a follower sees, and the
interim text made whole for showing."""

from __future__ import annotations

import asyncio

import pytest

from gateway.kernel.events import OutboundMessage
from gateway.kernel.streams import ReplyStream, interim_markdown, stream_key


def target() -> OutboundMessage:
    return OutboundMessage(channel="local", chat_id="c1", text="", stream=stream_key(
        "local", "c1", "m1"))


async def test_a_follower_sees_text_status_reset_and_the_end() -> None:
    stream = ReplyStream(target())
    heard: list[tuple[str, str | None, str | None]] = []
    stream.listen(lambda s: heard.append((s.text, s.status, s.outcome)))
    stream.set_status("running web_fetch")
    stream.append("Hel")
    stream.append("lo")
    stream.reset()
    stream.append("Hi")
    waiter = asyncio.create_task(stream.wait(stream.revision))  # woken by the next change
    stream.close("final")
    await asyncio.wait_for(waiter, 1)
    stream.append("after the end")  # ignored
    stream.close("none")
    assert heard == [("", "running web_fetch", None), ("Hel", None, None),
                     ("Hello", None, None), ("", None, None), ("Hi", None, None),
                     ("Hi", None, "final")]
    assert stream.key == "local:c1:m1" and stream.first_text_at is not None


def test_a_stream_needs_its_key() -> None:
    with pytest.raises(ValueError, match="stream key"):
        ReplyStream(OutboundMessage(channel="local", chat_id="c1", text=""))


@pytest.mark.parametrize(("cut", "shown"), [
    ("Look:\n\n```python\nx = 1", "Look:\n\n```python\nx = 1\n```"),
    ("```\na\n```\nthen `co", "```\na\n```\nthen `co`"),
    ("it is **very", "it is **very**"),
    ("done `x` and **y**", "done `x` and **y**"),
])
def test_interim_text_closes_what_is_open(cut: str, shown: str) -> None:
    assert interim_markdown(cut) == shown
