"""What a snapshot keeps so that a replay rebuilds the same bytes, for every model call.

A snapshot names the texts its request was made of by their content hash (the system
prompt's layers, the runtime block, the tool list); the texts themselves go into the
database once per distinct content (``layer_texts``), so an edited SOUL.md leaves the older
snapshots replayable and an unchanged one costs nothing more per turn.

Each model call of a turn (or of a subagent's run) adds one entry to ``snapshot["calls"]``:
how many of the turn's own messages it carried, which earlier tool results the loop had
shortened to stay in the window, the tools offered, and a hash over all of it chained to the
first call's hash. The turn's messages are stored anyway, so the entry stays small.
"""

from __future__ import annotations

import hashlib
import json
from itertools import islice
from operator import is_
from typing import Any

from agent.fingerprint import call_hash
from agent.runner import Transcript


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ToolTexts:
    """The tool lists offered, as (hash, JSON text), each list serialised once."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[list[dict[str, Any]], str, str]] = {}

    def of(self, tools: list[dict[str, Any]] | None) -> tuple[str, str] | None:
        if not tools:
            return None
        found = self._known.get(id(tools))
        if found is None or found[0] is not tools:
            if len(self._known) >= 256:
                self._known.clear()
            text = json.dumps(tools, sort_keys=True, ensure_ascii=False)
            found = self._known[id(tools)] = (tools, text_hash(text), text)
        return found[1], found[2]


TOOL_TEXTS = ToolTexts()


class RecordingTranscript(Transcript):
    """Run hooks that keep what was done (``Transcript``) and add each model call's entry to
    ``snapshot["calls"]``; ``texts`` gets the tool lists' texts by hash."""

    def __init__(self, snapshot: dict[str, Any] | None, texts: dict[str, str],
                 base: list[dict[str, Any]]) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.texts = texts
        self.base = base

    def on_request(self, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> None:
        snapshot = self.snapshot
        if snapshot is None:
            return
        calls = snapshot.setdefault("calls", [])
        added = self.so_far.new_messages
        base, start = self.base, len(self.base)
        if all(map(is_, messages, base)) and all(map(is_, islice(messages, start, None), added)):
            shortened: dict[int, dict[str, Any]] = {}  # (most calls: compared at C speed)
        else:
            shortened = {i: messages[i] for i in range(len(messages))
                         if messages[i] is not (base[i] if i < start else added[i - start])}
        tool_text = TOOL_TEXTS.of(tools)
        if tool_text is not None:
            self.texts.setdefault(*tool_text)
        calls.append({
            "added": len(added), "shortened": sorted(shortened),
            "tools": tool_text[0] if tool_text else None,
            "hash": snapshot["hash"] if not added and not shortened
            else call_hash(snapshot["hash"], added, shortened)})
