"""The ``memory`` tool: remember a note (a lasting fact or today's log) or search past notes.

One tool with an ``action`` costs fewer schema tokens than two. The store comes from
``memory_store_for``, the same cached instance the context builder recalls from, so the index is
built once for both. The log's date is the turn's ``received_at`` in the configured timezone, not
the clock, so a replayed turn writes to the same day.

Whose memory: the turn's audience (``agent/trust.py``) names the scope a note is written to
(the speaker's own; the owner's lasting facts go to MEMORY.md) and the scopes a search reads,
so one person never finds another's notes.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from agent.tools.base import Tool, ToolRetry
from agent.turn import TurnContext
from gateway.kernel.config import MemoryConfig
from workspace.memory import (
    Hit,
    MemoryKind,
    MemoryRefused,
    MemoryScope,
    MemoryStore,
    memory_store_for,
)

SEARCH_HITS = 5


async def _remember(store: MemoryStore, ctx: TurnContext, text: str, kind: MemoryKind) -> str:
    """``store`` is the scope the audience writes ``kind`` to."""
    try:
        saved = await asyncio.to_thread(store.remember, text, kind=kind, when=ctx.received_at)
    except MemoryRefused as exc:
        raise ToolRetry(str(exc)) from None
    if not saved.written:
        return f"Already in {saved.path}; nothing written."
    return f"Saved to {saved.path}."


def _search_all(stores: list[MemoryStore], text: str) -> list[Hit]:
    hits = [h for store in stores for h in store.search(text, SEARCH_HITS)]
    hits.sort(key=lambda h: (-h.score, h.path, h.line))
    return hits[:SEARCH_HITS]


async def _search(stores: list[MemoryStore], text: str) -> str:
    hits = await asyncio.to_thread(_search_all, stores, text)
    if not hits:
        return (f"No memory matches {text!r}. Search matches words, not meaning: try other "
                "words.")
    return "\n\n".join(f"{hit.path}:{hit.line}\n{hit.text}" for hit in hits)


def memory_tool(config: MemoryConfig, *, timezone: str = "UTC") -> Tool:
    """The tool for ``config``; without daily logs it has no ``kind`` (every note is a fact)."""

    def store_for(ctx: TurnContext, scope: MemoryScope) -> MemoryStore:
        return memory_store_for(ctx.workspace, config, timezone=timezone, scope=scope)

    def readable(ctx: TurnContext) -> list[MemoryStore]:
        return [store_for(ctx, scope) for scope in ctx.access.recall]

    def writable(ctx: TurnContext, kind: MemoryKind) -> MemoryStore:
        audience = ctx.access
        return store_for(ctx, audience.facts if kind == "fact" else audience.notes)

    async def memory(ctx: TurnContext, action: Literal["remember", "search"], text: str,
                     kind: Literal["fact", "log"] = "log") -> str:
        """Save a note for later conversations, or search saved notes.

        Args:
            action: remember saves text; search finds notes sharing its words.
            text: the note (self-contained) or the search words.
            kind: log: today's log, recalled when relevant; fact: lasting, in MEMORY.md
                (always in your prompt: keep it short).
        """
        if action == "search":
            return await _search(readable(ctx), text)
        return await _remember(writable(ctx, kind), ctx, text, kind)

    async def memory_facts(ctx: TurnContext, action: Literal["remember", "search"],
                           text: str) -> str:
        """Save a lasting fact to MEMORY.md (always in your prompt; keep it short), or search
        saved notes.

        Args:
            action: remember saves text; search finds notes sharing its words.
            text: the fact (self-contained) or the search words.
        """
        if action == "search":
            return await _search(readable(ctx), text)
        return await _remember(writable(ctx, "fact"), ctx, text, "fact")

    return Tool(memory if config.daily_log else memory_facts, name="memory", group="memory")
