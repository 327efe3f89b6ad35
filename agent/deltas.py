"""The answer's text while the model writes it: what a streamed model call hands on.

``Provider.complete(..., deltas=)`` calls ``deltas.text(piece)`` for each piece of content the
server streams and ``deltas.restart()`` before each try (a retry or a fallback starts the text
again). ``ThinkFilter`` keeps the reasoning local models write as ``<think>…</think>`` out of
what is shown, across chunk boundaries, by the same rule as ``llm_types.without_reasoning``
(which stays the judge of the final text).
"""

from __future__ import annotations

from typing import Protocol

OPEN = "<think>"
CLOSE = "</think>"


class TextDeltas(Protocol):
    def text(self, piece: str) -> None: ...

    def restart(self) -> None: ...


class ThinkFilter:
    """Feed the raw pieces; get back what a reader may see so far.

    ``feed`` returns ``(restart, visible)``: ``restart`` when what was shown must be taken
    back (a lone ``</think>``: everything before it was reasoning), ``visible`` the new text
    to show after that. Text that could still be the start of a tag is held back."""

    __slots__ = ("_held", "_state")

    def __init__(self) -> None:
        self._state = "start"  # start → think → after, or start → plain → (after)
        self._held = ""

    def feed(self, piece: str) -> tuple[bool, str]:
        self._held += piece
        restart = False
        if self._state == "start":
            head = self._held.lstrip()
            if not head or (len(head) < len(OPEN) and OPEN.startswith(head.lower())):
                return False, ""
            self._state = "think" if head[:len(OPEN)].lower() == OPEN else "plain"
            if self._state == "think":
                self._held = head[len(OPEN):]
        if self._state == "think":
            at = self._held.lower().find(CLOSE)
            if at < 0:
                self._held = self._held[-len(CLOSE):]  # only a tag's start matters
                return False, ""
            self._held = self._held[at + len(CLOSE):].lstrip()
            self._state = "after" if self._held else "trim"
            return self._flush(restart)
        if self._state == "trim":
            self._held = self._held.lstrip()
            if not self._held:
                return False, ""
            self._state = "after"
        if self._state == "plain":
            lower = self._held.lower()
            if OPEN in lower:  # a tag in the middle of the answer: talk about tags
                self._state = "after"
            elif (at := lower.find(CLOSE)) >= 0:  # the opening tag was in the prompt
                self._held = self._held[at + len(CLOSE):].lstrip()
                self._state = "after" if self._held else "trim"
                return self._flush(True)
        return self._flush(restart)

    def _flush(self, restart: bool) -> tuple[bool, str]:
        out = self._held
        if self._state == "plain":  # hold back what may be the start of a tag
            for n in range(min(len(CLOSE) - 1, len(out)), 0, -1):
                tail = out[-n:].lower()
                if CLOSE.startswith(tail) or OPEN.startswith(tail):
                    self._held = out[-n:]
                    return restart, out[:-n]
        self._held = ""
        return restart, out
