"""A reply while it is written: the one handle per turn between the agent and a channel.

The agent (``agent/turn_flow.py``) opens a ``ReplyStream`` through the bus when its turn
starts (``MessageBus.open_stream``; None when the chat's channel shows nothing live) and
feeds it the answer's text as the model writes it, a status line while tools run, and how
the turn ended. Whoever opened it for the channel (``gateway/streaming.py``) follows it with
``wait``; others may ``listen`` (called synchronously on every change, e.g. an
OpenAI-compatible endpoint that relays the deltas).

The stream never owns the final message: the turn's reply goes through the outbox as always,
carrying the stream's ``key`` (``OutboundMessage.stream``), and the outbox edits or replaces
what the stream showed exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

from gateway.kernel.events import OutboundMessage

_log = logging.getLogger(__name__)

Outcome = Literal["final", "none", "shutdown"]
"""How a turn's stream ended: ``final`` — a reply (or an error line) follows through the
outbox; ``none`` — nothing follows (``/stop``, a tool already answered): what was shown is
taken away; ``shutdown`` — the gateway stops mid-turn: what was shown stays, and the turn is
answered after the next start into the same message."""


def stream_key(channel: str, chat_id: str, message_id: str) -> str:
    """The key of the stream answering one inbound message: the same after a restart."""
    return f"{channel}:{chat_id}:{message_id}"


class ReplyStream:
    """The growing text of one reply, its status line and its end."""

    __slots__ = ("_changed", "_listeners", "_parts", "_text", "first_text_at", "outcome",
                 "revision", "status", "target")

    def __init__(self, target: OutboundMessage) -> None:
        if target.stream is None:
            raise ValueError("a reply stream's target needs its stream key")
        self.target = target
        """Where the reply goes (channel, chat, thread, the message it answers)."""
        self._parts: list[str] = []
        self._text: str | None = ""
        self.status: str | None = None
        """What the turn is doing while no answer text is shown (``running web_fetch``)."""
        self.revision = 0
        self.outcome: Outcome | None = None
        self.first_text_at: float | None = None
        """``time.perf_counter()`` when the first text came (the bench's latency)."""
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[ReplyStream], None]] = []

    @property
    def key(self) -> str:
        return self.target.stream or ""

    @property
    def text(self) -> str:
        """The answer's text so far."""
        if self._text is None:
            self._text = "".join(self._parts)
            self._parts = [self._text]
        return self._text

    @property
    def closed(self) -> bool:
        return self.outcome is not None

    def append(self, piece: str) -> None:
        if self.closed or not piece:
            return
        if self.first_text_at is None:
            self.first_text_at = time.perf_counter()
        self._parts.append(piece)
        self._text = None
        self.status = None
        self._bump()

    def reset(self) -> None:
        """Take back the text so far (a retry writes it again; tool calls came instead)."""
        if self.closed or not (self._parts and self.text):
            return
        self._parts, self._text = [], ""
        self._bump()

    def set_status(self, status: str | None) -> None:
        if self.closed or status == self.status:
            return
        self.status = status
        self._bump()

    def close(self, outcome: Outcome) -> None:
        if self.closed:
            return
        self.outcome = outcome
        self._bump()

    def listen(self, listener: Callable[[ReplyStream], None]) -> None:
        self._listeners.append(listener)

    async def wait(self, seen: int) -> None:
        """Until ``revision`` is past ``seen``."""
        while self.revision <= seen:
            self._changed.clear()
            await self._changed.wait()

    def _bump(self) -> None:
        self.revision += 1
        self._changed.set()
        for listener in self._listeners:
            try:
                listener(self)
            except Exception:
                _log.exception("reply stream listener failed")


def interim_markdown(text: str) -> str:
    """``text`` cut mid-answer, made whole for showing: a code fence left open is closed
    (else everything after it would show as code, and a later edit would jump), and so are
    an inline code span and bold left open in the last paragraph."""
    fences = 0
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fences += 1
    if fences % 2:
        return f"{text}\n```"
    last = text.rsplit("\n\n", 1)[-1]
    if last.count("`") % 2:
        return f"{text}`"
    if last.count("**") % 2:
        return f"{text.rstrip()}**"
    return text
