"""A streamed request's answer, live: the turn's text relayed to the client while the model
writes it (``stream: true`` on ``/v1/chat/completions``).

Before the request's message goes to the bus, ``LiveAnswer`` asks the bus for the turn's
``ReplyStream`` (``MessageBus.watch_stream``; the turn makes one for it even where nothing
else shows replies live, so the model call is streamed) and follows its text; the stored
reply, when it comes back through the outbox to the channel's ``send``, has the last word.

The rule (``Relay``), since an OpenAI client cannot be made to un-see text:

- Text is sent as it is written, trimmed the way the stored answer is (leading whitespace,
  and trailing whitespace until more text follows it, wait).
- While the live text is only behind what was sent (it was taken back and is being written
  again: a retry), nothing is sent; once it extends what was sent, the rest goes out.
- When the stored answer comes and extends what was sent, the rest of it is sent: the
  chunks concatenate to the stored answer exactly. This is every turn whose text was not
  taken back after it went out.
- When text already sent was taken back for something else — the model wrote words and then
  called a tool, a retry wrote a different answer, the turn ended in an error line — that
  text stays with the client; the stream goes on after a blank line (``BREAK``) with the text
  that replaced it, and always ends with the stored answer (or the error line) whole. A
  non-streamed request gets the stored answer only.
- A turn that opened no stream (a command, a message over a limit) is sent as its stored
  reply, in pieces. An error reply before any text was sent is a plain 502, as without
  streaming.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from channels.openai_wire import pieces
from gateway.kernel.bus import MessageBus
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.streams import ReplyStream, stream_key

BREAK = "\n\n"
"""Between text the client already has and the text that replaced it."""


class TurnFailed(Exception):
    """The turn ended in Parley's error line instead of an answer."""


class Relay:
    """What of the reply the client has, and what to send it next. Pure."""

    __slots__ = ("_shown", "sent")

    def __init__(self) -> None:
        self._shown = ""
        """The text of the current run (since the last ``BREAK``) the client has."""
        self.sent = ""
        """Everything the client was sent, in order."""

    def live(self, text: str) -> str:
        """The piece to send for the live text so far ('' for nothing yet)."""
        ready = text.strip()
        if ready.startswith(self._shown):
            return self._send(ready[len(self._shown):], ready)
        if self._shown.startswith(ready):  # taken back and being written again
            return ""
        return self._send(BREAK + ready, ready)

    def final(self, text: str) -> str:
        """The rest to send for the stored answer ``text``: what it adds to what was sent,
        or, when it does not extend it, a ``BREAK`` and the whole of it."""
        if not self.sent:
            return self._send(text, text)
        if text.startswith(self._shown):
            return self._send(text[len(self._shown):], text)
        return self._send(BREAK + text, text)

    def _send(self, piece: str, shown: str) -> str:
        self._shown = shown
        self.sent += piece
        return piece


class LiveAnswer:
    """The text of one streamed request: its turn's stream while it lasts, then the stored
    reply (``pieces``). Made before the message is published."""

    def __init__(self, bus: MessageBus, msg: InboundMessage) -> None:
        self._bus = bus
        self._key = stream_key(msg.channel, msg.chat_id, msg.message_id)
        self._stream: ReplyStream | None = None
        self._wake: asyncio.Future[None] | None = None
        bus.watch_stream(self._key, self._attach)

    def close(self) -> None:
        """The request is over: a stream its turn opens later is not wanted."""
        self._bus.unwatch_stream(self._key)

    def _attach(self, stream: ReplyStream) -> None:
        self._stream = stream
        stream.listen(lambda _: self._woken())
        self._woken()

    def _woken(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def pieces(self, reply: asyncio.Future[OutboundMessage]) -> AsyncIterator[str]:
        """The answer's text in order (``Relay``'s rule). Raises ``TurnFailed`` for an error
        reply before any text was sent."""
        relay = Relay()
        loop = asyncio.get_running_loop()
        reply.add_done_callback(lambda _: self._woken())
        try:
            while not reply.done():
                self._wake = loop.create_future()
                if self._stream is not None and (piece := relay.live(self._stream.text)):
                    yield piece
                    continue
                await self._wake
        finally:
            self.close()
            self._wake = None
        answer = reply.result()
        if answer.kind == "error" and not relay.sent:
            raise TurnFailed(answer.text)
        if not relay.sent:  # nothing live (a command): the stored reply in pieces
            for piece in pieces(answer.text):
                yield piece
            return
        if rest := relay.final(answer.text):
            yield rest
