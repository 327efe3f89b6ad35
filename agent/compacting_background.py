"""Compaction off the critical path (issue 24): the summary is made after a turn has answered.

Once a session's history approaches its budget (``compact_at_share`` of the history room, or
of ``max_recent_messages``), the turn that noticed it answers first and then starts the
summary in the background; the next turn finds it stored and builds on it. A turn waits for a
summary only when its history cannot fit otherwise (more messages stored than the window
reads, or whole turns left out): it waits for the one already running, if any, and only then
summarises itself, saying so in progress.

One summary per session at a time (a lock per session): the background one and a turn's own
never summarise the same span twice — whoever comes second re-reads the stored compaction and
finds nothing left to do. A summary is stored in one write when it is done; a shutdown that
cancels it midway stores nothing, and the history it would have summarised stays as it was.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from agent.compacting import SessionCompaction
from agent.compaction import CompactionFailed
from agent.context import BuiltContext
from agent.turn import TurnContext, TurnNotes
from gateway.kernel.events import new_id
from gateway.kernel.store import Compaction, Store
from gateway.kernel.tasks import TaskSet

_log = logging.getLogger(__name__)

LOCKS_KEPT = 4096
"""Sessions whose lock is remembered; an idle lock is dropped first."""


class BackgroundCompaction:
    def __init__(self, compaction: SessionCompaction, store: Store, tasks: TaskSet,
                 max_recent_messages: int) -> None:
        self.compaction = compaction
        self.store = store
        self.tasks = tasks
        self.max_recent_messages = max_recent_messages
        self._locks: dict[int, asyncio.Lock] = {}
        self._running: dict[int, asyncio.Task[None]] = {}
        self._pending: dict[int, tuple[TurnContext, Compaction | None]] = {}
        """Per session: the summary to make once its running flush is done (ctx, seen)."""
        self._flushing: dict[int, bool] = {}
        """Per session running: whether it is a flush only."""
        self.started = 0
        """Background summaries started (for tests and status)."""
        self.waited = 0
        """Turns that had to wait for a summary (their history could not fit otherwise)."""

    def lock(self, session_id: int) -> asyncio.Lock:
        found = self._locks.get(session_id)
        if found is None:
            if len(self._locks) >= LOCKS_KEPT:
                idle = next((k for k, v in self._locks.items() if not v.locked()), None)
                if idle is not None:
                    del self._locks[idle]
            found = self._locks[session_id] = asyncio.Lock()
        return found

    @staticmethod
    def must_wait(built: BuiltContext, more: bool) -> bool:
        """The history cannot fit without a summary: more stored than the window reads, or
        whole turns left out."""
        return more or built.dropped_turns > 0

    def approaching(self, built: BuiltContext, history_messages: int) -> bool:
        """After this turn, summarise in the background: the history passed
        ``compact_at_share`` of its token room, or the next turn would find more messages
        stored than the window reads (this turn adds at least its question and answer)."""
        share = self.compaction.settings.compact_at_share
        return (built.history_total > share * built.history_room
                or history_messages + 2 > self.max_recent_messages)

    def start(self, ctx: TurnContext, seen: Compaction | None, *,
              flush_only: bool = False) -> None:
        """Summarise ``ctx``'s session in the background (``flush_only``: only the memory
        flush that comes before it, at ``memory_flush_at_share``). While one of the session
        runs: a summary asked for while a flush runs follows it; anything else asked for
        meanwhile is what runs already (a summary starts a new cycle: its flush is moot).
        ``seen``: the summary the turn was built on; if another one is stored by the time
        this would run, the turn's view is stale and nothing is done."""
        sid = ctx.session_id
        if not self.compaction.enabled:
            return
        if sid in self._running:
            if self._flushing.get(sid) and not flush_only:
                self._pending[sid] = (ctx, seen)
            return
        self.started += 1
        own = replace(ctx, turn_id=new_id(), notes=TurnNotes())
        task = self.tasks.spawn(self._run(own, seen, flush_only), name=f"compaction-{sid}")
        self._running[sid] = task
        self._flushing[sid] = flush_only
        task.add_done_callback(lambda _t: self._next(sid))

    def _next(self, session_id: int) -> None:
        self._running.pop(session_id, None)
        self._flushing.pop(session_id, None)
        waiting = self._pending.pop(session_id, None)
        if waiting is not None:
            self.start(waiting[0], waiting[1])

    @property
    def idle(self) -> bool:
        """No background summary runs."""
        return not self._running

    async def settle(self, session_id: int) -> bool:
        """Wait for the session's background summary, if one runs; True if one did."""
        task = self._running.get(session_id)
        if task is None:
            return False
        await asyncio.wait({task})
        return True

    async def compact_now(self, ctx: TurnContext, seen: Compaction | None) -> Compaction:
        """A turn's own summary, under the session's lock. If another summary landed since
        ``seen`` was read, that one is returned (the span is not summarised twice)."""
        self.waited += 1
        async with self.lock(ctx.session_id):
            latest = await self.store.compaction(ctx.session_id)
            if latest is not None and (seen is None or latest.id != seen.id):
                return latest
            return await self.compaction.before_turn(ctx, latest)

    async def _run(self, ctx: TurnContext, seen: Compaction | None, flush_only: bool) -> None:
        async with self.lock(ctx.session_id):
            previous = await self.store.compaction(ctx.session_id)
            if (previous.id if previous else None) != (seen.id if seen else None):
                return  # a summary landed since the turn looked: its view is stale
            try:
                if flush_only:
                    await self.compaction.flush_early(ctx, previous)
                else:
                    await self.compaction.before_turn(ctx, previous)
            except CompactionFailed as exc:
                _log.info("background compaction of %s skipped: %s", ctx.message.session_key,
                          exc)
            except Exception:  # our bug or the model failing: the next turn tries again
                _log.exception("background compaction of %s failed", ctx.message.session_key)
