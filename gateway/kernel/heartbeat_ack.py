"""The heartbeat's "nothing to report" answer: asked for by the heartbeat scheduler
(``gateway/heartbeat.py``), recognised by the agent, which then keeps the reply unsent."""

from __future__ import annotations

import re

HEARTBEAT_OK = "HEARTBEAT_OK"
HEARTBEAT_CHANNEL = "heartbeat"
"""The system channel of heartbeat turns: their session is ``heartbeat:main``."""
ACK_MAX_CHARS = 300
"""Text allowed beside ``HEARTBEAT_OK`` that still counts as "nothing to report"."""

_MARKUP = r"[\s*_`~]*"
_AT_START = re.compile(rf"^{_MARKUP}{HEARTBEAT_OK}(?!\w){_MARKUP}[.!]?")
_AT_END = re.compile(rf"{_MARKUP}(?<!\w){HEARTBEAT_OK}{_MARKUP}[.!]?{_MARKUP}$")


def heartbeat_ok(text: str, max_other: int = ACK_MAX_CHARS) -> bool:
    """True for "nothing to report": ``HEARTBEAT_OK`` alone, or at the start or the end of the
    reply with at most ``max_other`` other characters (markup around it does not count)."""
    stripped = text.strip()
    for pattern in (_AT_START, _AT_END):
        match = pattern.search(stripped)
        if match:
            rest = (stripped[:match.start()] + stripped[match.end():]).strip()
            if len(rest) <= max_other:
                return True
    return False
