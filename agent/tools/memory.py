"""The ``memory`` tool: remember a note (a lasting fact or today's log) or search past notes.

One tool with an ``action`` costs fewer schema tokens than two. The store comes from
``memory_store_for``, the same cached instance the context builder recalls from, so the index is
built once for both. The log's date is the turn's ``received_at`` in the configured timezone, not
the clock, so a replayed turn writes to the same day.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from agent.tools.base import Tool, ToolRetry
from agent.turn import TurnContext
from gateway.kernel.config import MemoryConfig
from workspace.memory import MemoryKind, MemoryRefused, MemoryStore, memory_store_for

SEARCH_HITS = 5


async def _remember(store: MemoryStore, ctx: TurnContext, text: str, kind: MemoryKind) -> str:
    try:
        saved = await asyncio.to_thread(store.remember, text, kind=kind, when=ctx.received_at)
    except MemoryRefused as exc:
        raise ToolRetry(str(exc)) from None
    if not saved.written:
        return f"Already in {saved.path}; nothing written."
    return f"Saved to {saved.path}."


async def _search(store: MemoryStore, text: str) -> str:
    hits = await asyncio.to_thread(store.search, text, SEARCH_HITS)
    if not hits:
        return (f"No memory matches {text!r}. Search matches words, not meaning: try other "
                "words.")
    return "\n\n".join(f"{hit.path}:{hit.line}\n{hit.text}" for hit in hits)


def memory_tool(config: MemoryConfig, *, timezone: str = "UTC") -> Tool:
    """The tool for ``config``; without daily logs it has no ``kind`` (every note is a fact)."""

    def store_for(ctx: TurnContext) -> MemoryStore:
        return memory_store_for(ctx.workspace, config, timezone=timezone)

    async def memory(ctx: TurnContext, action: Literal["remember", "search"], text: str,
                     kind: Literal["fact", "log"] = "log") -> str:
        """Save a note for later conversations, or search saved notes.

        Args:
            action: remember saves text; search finds notes sharing its words.
            text: the note (self-contained) or the search words.
            kind: log: today's log, recalled when relevant. fact: lasting, kept in MEMORY.md
                (always in your prompt; keep it short).
        """
        store = store_for(ctx)
        if action == "search":
            return await _search(store, text)
        return await _remember(store, ctx, text, kind)

    async def memory_facts(ctx: TurnContext, action: Literal["remember", "search"],
                           text: str) -> str:
        """Save a lasting fact to MEMORY.md (always in your prompt; keep it short), or search
        saved notes.

        Args:
            action: remember saves text; search finds notes sharing its words.
            text: the fact (self-contained) or the search words.
        """
        store = store_for(ctx)
        if action == "search":
            return await _search(store, text)
        return await _remember(store, ctx, text, "fact")

    return Tool(memory if config.daily_log else memory_facts, name="memory", group="memory")
