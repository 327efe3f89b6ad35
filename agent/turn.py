"""What one agent turn knows, in one typed object.

Routing (which chat a reply or a scheduled job goes to) is read from here, never from the
model's tool arguments, so one session can never write into another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gateway.kernel.config import ToolsConfig
from gateway.kernel.events import ChatType, InboundKind, new_id

if TYPE_CHECKING:
    from gateway.kernel.cron_jobs import CronJob, NewJob
    from gateway.kernel.events import OutboundMessage
    from gateway.kernel.values import Delivery

ANSWERED_CURRENT_CHAT = "answered_current_chat"
"""``TurnServices.state`` key: a tool already sent this turn's answer to its chat, so the loop
stores the final reply without sending it again."""


class Spawner(Protocol):
    """What ``TurnServices.spawn`` holds: run ``task`` in a subagent for the turn ``ctx``
    (``agent/subagent.py``)."""

    async def __call__(self, ctx: TurnContext, task: str, *, background: bool) -> str: ...


class CronService(Protocol):
    """The scheduled jobs a tool may manage (``gateway.cron.CronJobs``)."""

    timezone: str
    """Where naive times are read: ``cron.timezone``, else ``agent.timezone``."""

    async def add(self, new: NewJob) -> CronJob: ...

    async def jobs(self, *, channel: str | None = None, chat_id: str | None = None,
                   with_last: bool = True) -> list[CronJob]: ...

    async def remove(self, job_id: str, *, channel: str | None = None,
                     chat_id: str | None = None) -> bool: ...


@dataclass(slots=True, kw_only=True)
class TurnServices:
    """What the gateway lets a tool do beyond the workspace, bound to one turn by the loop.

    A field is None where the capability is off (or in tests that don't need it). Routing
    never comes from the model: a service decides the target from the TurnContext.
    """

    send: Callable[[OutboundMessage], Awaitable[Delivery]] | None = None
    """Deliver a message now through the outbox and return the real delivery result."""
    state: dict[str, Any] = field(default_factory=dict)
    """Per-turn notes tools leave for the loop (e.g. that the current chat was answered)."""
    cron: CronService | None = None
    """Scheduled jobs; None where the gateway runs no scheduler (``parley chat``)."""
    spawn: Spawner | None = None
    """Runs a task in a subagent (``agent/subagent.py``); None where spawning is off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    session_key: str
    session_id: int
    channel: str
    chat_id: str
    sender_id: str
    workspace: Path
    received_at: datetime
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    sender_name: str | None = None
    chat_type: ChatType = "direct"
    thread_id: str | None = None
    message_id: str | None = None
    kind: InboundKind = "user"
    deliver_to: tuple[str, str] | None = None
    """A system turn's (cron, heartbeat) target chat; None for a user's own chat."""
    deliver_thread: str | None = None
    """The thread of ``deliver_to`` a system turn answers in (a topic the job was made in)."""
    turn_id: str = field(default_factory=new_id)
    services: TurnServices = field(default_factory=TurnServices)

    @property
    def reply_target(self) -> tuple[str, str] | None:
        """The chat this turn answers: the one it came from, or a system turn's target
        (None: a system turn with nowhere to deliver, e.g. ``heartbeat.target: none``)."""
        if self.deliver_to is not None:
            return self.deliver_to
        if self.kind in ("cron", "heartbeat"):
            return None
        return (self.channel, self.chat_id)

    @property
    def reply_thread(self) -> str | None:
        """The thread of ``reply_target`` this turn answers in."""
        return self.deliver_thread if self.deliver_to is not None else (
            None if self.kind in ("cron", "heartbeat") else self.thread_id)
