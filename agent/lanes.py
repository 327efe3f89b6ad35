"""Lanes: one per busy session, its messages in arrival order, one turn at a time.

A message that arrives while its session is busy waits in the lane (``agent.queue_mode``
decides how, ``agent/queueing.py``) and is never dropped. Lanes exist only while they have
work, so idle sessions cost nothing in memory: they live in SQLite. Turns of different
sessions run concurrently up to ``agent.max_concurrent_turns``. ``/stop`` cancels a lane's
running turn at once; the lane then goes on with what waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from agent.queueing import Work, fold, next_batch
from gateway.kernel.config import AgentConfig
from gateway.kernel.events import TRUST_RANK, InboundMessage, Trust
from gateway.kernel.tasks import TaskSet

STOP_WAIT = 5.0
"""How long ``/stop`` waits for the cancelled turn to store what it did before answering."""


@dataclass(slots=True)
class Lane:
    waiting: list[Work] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    current: Work | None = None
    stop_requested: bool = False
    """The running turn was cancelled by ``/stop`` (not by a shutdown): it keeps what it did."""

    def take_arrived(self, trust: Trust) -> list[Work]:
        """What a running turn of a ``trust`` sender may take up now (``steer`` mode): the
        waiting messages up to the first command, context-only message or less trusted
        sender's message, which are handled on their own (a guest never steers the owner's
        turn, whose tools are the owner's)."""
        taken = 0
        for work in self.waiting:
            if work.msg.is_command or work.msg.context_only or \
                    TRUST_RANK[work.msg.trust] < TRUST_RANK[trust]:
                break
            taken += 1
        arrived = self.waiting[:taken]
        del self.waiting[:taken]
        return arrived


Handler = Callable[[Work, Lane], Coroutine[Any, Any, None]]


class Lanes:
    def __init__(self, *, config: AgentConfig, tasks: TaskSet, handle: Handler,
                 on_queued: Callable[[InboundMessage], None] | None = None) -> None:
        """``handle`` runs one piece of work of a lane (a turn, a command); ``on_queued``
        hears of a message that waits behind a running one."""
        self.config = config
        self._on_queued = on_queued
        self._tasks = tasks
        self._handle = handle
        self._limit = asyncio.Semaphore(config.max_concurrent_turns)
        self._lanes: dict[str, Lane] = {}

    def __len__(self) -> int:
        return len(self._lanes)

    def __contains__(self, session_key: object) -> bool:
        return session_key in self._lanes

    @property
    def queued(self) -> int:
        return sum(len(lane.waiting) for lane in self._lanes.values())

    def waiting(self, session_key: str) -> int:
        """Turns waiting in the session's lane (a fold of several messages counts once)."""
        lane = self._lanes.get(session_key)
        return len(lane.waiting) if lane else 0

    def waiting_messages(self, session_key: str) -> int:
        """Inbound messages waiting in the session's lane, each folded one counted."""
        lane = self._lanes.get(session_key)
        return sum(len(work.sources) for work in lane.waiting) if lane else 0

    def add(self, msg: InboundMessage) -> None:
        """Queue ``msg`` in its session's lane, starting the lane if it was idle."""
        key = msg.session_key
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane()
        lane.waiting.append(Work(msg))
        lane.waiting = fold(lane.waiting, self.config.queue_cap)
        if lane.task is None:
            lane.task = self._tasks.spawn(self._drain(key, lane), f"lane:{key}")
        elif self._on_queued is not None:
            self._on_queued(msg)

    async def _drain(self, key: str, lane: Lane) -> None:
        try:
            while lane.waiting:
                work, taken = next_batch(lane.waiting, self.config.queue_mode)
                del lane.waiting[:taken]
                async with self._limit:
                    await self._run(key, lane, work)
        finally:
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    async def _run(self, key: str, lane: Lane, work: Work) -> None:
        """One piece of work, in a task of its own so that ``/stop`` can cancel it alone."""
        lane.current, lane.stop_requested = work, False
        lane.turn = asyncio.create_task(self._handle(work, lane), name=f"turn:{key}")
        try:
            await lane.turn
        except asyncio.CancelledError:
            if not lane.stop_requested or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise
        finally:
            lane.turn = lane.current = None

    async def stop(self, session_key: str) -> str:
        """``/stop``: cancel the session's running turn at once; returns what to tell the chat."""
        lane = self._lanes.get(session_key)
        turn = lane.turn if lane else None
        if lane is None or turn is None or turn.done():
            return "Nothing is running."
        lane.stop_requested = True
        turn.cancel()
        await asyncio.wait({turn}, timeout=STOP_WAIT)
        text = "Stopped. What you sent is kept in the conversation."
        if waiting := len(lane.waiting):
            text += f" {waiting} message(s) waiting will be answered next."
        return text
