"""Serialised forms remembered by object identity: a session's history is the same message
dicts turn after turn (``agent/history.py``), never changed once built, so each is serialised
once for the context hash (``context.py``) and once for the request body (``openai_http.py``).

Bounded by the bytes it holds (the serialised forms; the dicts it keeps alive are about as
large), not by a count: a turn's fresh dicts (the system prompt, the runtime block) are
remembered too and would otherwise pile up to megabytes before a count was reached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_BYTES = 2 * 1024 * 1024


class IdentityMemo:
    def __init__(self, encode: Callable[[Any], bytes], max_bytes: int = MAX_BYTES) -> None:
        self._encode = encode
        self._max = max_bytes
        self._kept: dict[int, tuple[Any, bytes]] = {}
        self.bytes = 0

    def __call__(self, value: Any) -> bytes:
        found = self._kept.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        text = self._encode(value)
        if self.bytes + len(text) > self._max:  # start again: the live history comes back
            self._kept.clear()
            self.bytes = 0
        self._kept[id(value)] = (value, text)
        self.bytes += len(text)
        return text
