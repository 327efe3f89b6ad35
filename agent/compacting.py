"""When a session is compacted (``agent/compaction.py`` does the summarising).

Three moments: before a turn whose history no longer fits (the newest turns within
``keep_recent_share`` of the room stay word for word), after the server refused a request as
too large (a quarter of that, and only the last exchange), and on ``/compact [focus]``.
Before summarising, the agent may save lasting facts with the memory tool
(``compaction.memory_flush``): a silent turn of its own that stores and sends nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Literal, TypeVar

from agent.assembly import ContextAssembly
from agent.budget import keep_tokens, summary_cap
from agent.commands import parse_command
from agent.compaction import FLUSH_PROMPT, CompactionFailed, Compactor, Split, split_history
from agent.context import BuiltContext
from agent.errors import ProviderError
from agent.llm_types import LLMResponse
from agent.provider import Provider
from agent.runner import Runner, Transcript
from agent.tools.base import ToolRegistry
from agent.turn import TurnContext
from agent.usage import Ledger
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Compaction, Store, StoredMessage

_log = logging.getLogger(__name__)

MANUAL_KEEP = 2
"""/compact and a context overflow keep only the last exchange word for word."""
COMPACTION_READ_LIMIT = 5000
"""Most messages read to choose what to summarise (only when compacting)."""
FLUSHED_KEPT = 4096
"""Sessions whose flush cycle is remembered (in memory: after a restart a cycle may flush
once more)."""
T = TypeVar("T")


class SessionCompaction:
    def __init__(self, *, config: Config, store: Store, provider: Provider,
                 registry: ToolRegistry, assembly: ContextAssembly,
                 compactor: Compactor, ledger: Ledger | None = None) -> None:
        """``ledger``: where the summary's and the memory flush's model calls are counted."""
        self.config = config
        self.settings = config.agent.context.compaction
        self.store = store
        self.provider = provider
        self.registry = registry
        self.assembly = assembly
        self.compactor = compactor
        self.ledger = ledger
        self._flushed: dict[int, int] = {}
        """Session → the compaction (0: none yet) whose cycle has had its memory flush."""

    def _remember_flush(self, session_id: int, previous: Compaction | None) -> None:
        if len(self._flushed) >= FLUSHED_KEPT:
            self._flushed.pop(next(iter(self._flushed)))
        self._flushed[session_id] = previous.id if previous else 0

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    async def before_turn(self, ctx: TurnContext, previous: Compaction | None) -> Compaction:
        """The history no longer fits: summarise what the newest turns leave over."""
        return await self.compact(ctx, previous, keep_share=self.settings.keep_recent_share)

    async def after_overflow(self, ctx: TurnContext,
                             previous: Compaction | None) -> Compaction:
        """The server refused the request as too large: its window is smaller than we
        thought, so keep much less."""
        return await self.compact(ctx, previous, keep_share=self.settings.keep_recent_share / 4,
                                  keep_messages=MANUAL_KEEP)

    async def command(self, msg: InboundMessage) -> str:
        """``/compact [focus]``: summarise the older part of the conversation now; returns
        what to tell the chat."""
        focus = parse_command(msg.text)[1] or None
        session = await self.store.active_session(msg.session_key)
        ctx = TurnContext(message=msg, session_id=session.id,
                          workspace=self.config.workspace_path, tools=self.config.agent.tools,
                          audience=self.assembly.audience(msg))
        previous = await self.store.compaction(session.id)
        try:
            entry = await self.compact(ctx, previous, keep_share=self.settings.keep_recent_share,
                                       keep_messages=MANUAL_KEEP, focus=focus)
        except CompactionFailed as exc:
            return f"Nothing was compacted: {exc}."
        return (f"Compacted {entry.messages_summarised} earlier message(s) "
                f"({entry.tokens_before:,} tokens) into a {entry.summary_tokens:,}-token "
                "summary. The full history stays saved.")

    def due(self, built: BuiltContext, more: bool, previous: Compaction | None,
            session_id: int) -> Literal["compact", "flush"] | None:
        """What a turn about to be built as ``built`` needs first: a compaction when its
        history passes ``compact_at_share`` of the history budget (or whole turns had to be
        left out, or more than ``max_recent_messages`` are stored); the memory flush alone
        when it passes ``memory_flush_at_share`` and this cycle has not flushed yet."""
        room, used = built.history_room, built.history_total
        if more or built.dropped_turns or used > self.settings.compact_at_share * room:
            return "compact"
        if self.settings.memory_flush and used > self.settings.memory_flush_at_share * room \
                and not self._flushed_in(session_id, previous):
            return "flush"
        return None

    def _flushed_in(self, session_id: int, previous: Compaction | None) -> bool:
        return self._flushed.get(session_id) == (previous.id if previous else 0)

    async def flush_early(self, ctx: TurnContext, previous: Compaction | None) -> None:
        """The soft threshold: the memory flush over what the coming compaction will
        summarise, once per compaction cycle (the compaction then does not flush again)."""
        split, _ = await self._split(ctx, previous, self.settings.keep_recent_share, None)
        if split.old:
            await self._spending(ctx, lambda spent: self._flush_memory(
                ctx, previous, split.old, spent))

    async def compact(self, ctx: TurnContext, previous: Compaction | None, *,
                      keep_share: float, keep_messages: int | None = None,
                      focus: str | None = None) -> Compaction:
        """Summarise the oldest part of the session; raises CompactionFailed."""
        split, budget = await self._split(ctx, previous, keep_share, keep_messages)
        if not split.old:
            raise CompactionFailed("nothing to compact yet")

        async def run(spent: list[LLMResponse]) -> Compaction:
            if self.settings.memory_flush and not self._flushed_in(ctx.session_id, previous):
                await self._flush_memory(ctx, previous, split.old, spent)
            cap = summary_cap(budget, self.settings.summary_max_tokens)
            return await self.compactor.compact(ctx.session_id, split, previous, focus, spent,
                                                max_tokens=cap)

        return await self._spending(ctx, run)

    async def _split(self, ctx: TurnContext, previous: Compaction | None, keep_share: float,
                     keep_messages: int | None) -> tuple[Split, int]:
        """What to summarise and what to keep, and the history budget it was chosen by."""
        start = previous.first_kept_id if previous else 0
        everything = await self.store.recent_messages(ctx.session_id, COMPACTION_READ_LIMIT,
                                                      from_id=start)
        # What every request of this chat carries besides the history: the message's own
        # text does not count, it is not sent again; nor does the summary being replaced.
        probe = self.assembly.build(replace(ctx.message, text="", media=()), [], None,
                                    turn_id=ctx.turn_id)
        budget = max(self.assembly.room - probe.snapshot["total_tokens"], 0)
        if keep_messages is None:
            keep_messages = self.config.agent.context.max_recent_messages // 2
        keep = keep_tokens(budget, keep_share, self.settings.keep_recent_max_tokens)
        return split_history(everything, keep_tokens=keep, keep_messages=keep_messages), budget

    async def _spending(self, ctx: TurnContext,
                        work: Callable[[list[LLMResponse]], Awaitable[T]]) -> T:
        """Run ``work``; its model calls go into the ledger as the turn's asker's."""
        spent: list[LLMResponse] = []
        try:
            return await work(spent)
        finally:
            if self.ledger is not None and spent:
                await asyncio.shield(self.ledger.record(ctx.session_id, ctx.turn_id,
                                                        ctx.message, spent))

    async def _flush_memory(self, ctx: TurnContext, previous: Compaction | None,
                            old: list[StoredMessage], spent: list[LLMResponse]) -> None:
        """A silent turn: the agent may save lasting facts before they are summarised.
        Nothing of it is stored in the conversation or delivered."""
        memory = self.registry.get("memory")
        audience = ctx.access
        # Into the speaker's memory if they may keep one; a group's conversation into the
        # group's own notes whoever spoke last.
        if memory is None or not (audience.tools.allows("memory") or audience.group_notes):
            return
        self._remember_flush(ctx.session_id, previous)
        ctx = replace(ctx, audience=audience.for_flush())
        builder = self.assembly.builder
        messages: list[dict[str, Any]] = [
            {"role": "system",
             "content": builder.system_prompt(owner_files=audience.owner_files).text}]
        if previous is not None:
            messages.append(builder.summary_message(previous))
        messages += [m.body for m in old]
        messages.append({"role": "user", "content": FLUSH_PROMPT})
        flusher = Runner(self.provider, ToolRegistry([memory]), max_iterations=4,
                         max_result_chars=self.config.agent.tools.max_result_chars)
        transcript = Transcript()
        try:
            await asyncio.wait_for(flusher.run(messages=messages, ctx=ctx, hooks=transcript),
                                   self.settings.timeout)
        except (TimeoutError, ProviderError) as exc:
            _log.warning("memory flush before compaction skipped: %s", exc)
        finally:
            spent.extend(transcript.so_far.responses)
