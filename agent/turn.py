"""What one agent turn knows, in one typed object.

Routing (which chat a reply or a scheduled job goes to) is read from here, never from the
model's tool arguments, so one session can never write into another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agent.trust import DEFAULT_POLICY, Audience
from gateway.kernel.config import ToolsConfig
from gateway.kernel.events import InboundMessage, new_id
from gateway.kernel.frozen import frozen

if TYPE_CHECKING:
    from gateway.kernel.cron_jobs import CronJob, NewJob
    from gateway.kernel.events import OutboundMessage
    from gateway.kernel.store import SearchHit
    from gateway.kernel.values import Delivery


class Spawner(Protocol):
    """What ``TurnServices.spawn`` holds: run ``task`` in a subagent for the turn ``ctx``
    (``agent/subagent.py``)."""

    async def __call__(self, ctx: TurnContext, task: str, *, background: bool) -> str: ...


class MessageSearch(Protocol):
    """``Store.search_messages``: past messages of one chat (and person) matching a query."""

    async def __call__(self, query: str, *, chat: str | None, person: str | None = None,
                       limit: int = 5) -> list[SearchHit]: ...


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
    cron: CronService | None = None
    """Scheduled jobs; None where the gateway runs no scheduler (``parley chat``)."""
    spawn: Spawner | None = None
    """Runs a task in a subagent (``agent/subagent.py``); None where spawning is off."""
    search: MessageSearch | None = None
    """Searches stored conversations (``session_search``); the scope is the tool's to set."""
    skill_folders: tuple[Path, ...] = ()
    """Skill folders outside the workspace (built-in, configured, ``~/.parley/skills``):
    read_file may read the skills' files there, and nothing else of those folders' parents."""


@dataclass(slots=True)
class TurnNotes:
    """What a turn's tools tell the turn while it runs (one per turn, never shared)."""

    answered_current_chat: bool = False
    """The message tool already sent this turn's answer to its chat: the final reply is
    stored but not sent again."""
    loaded: frozenset[str] = frozenset()
    """Tools loaded for this turn (``load_tools``, or used lately in the conversation):
    offered in full from the next model call on."""


@frozen(kw_only=True)
class TurnContext:
    message: InboundMessage
    """What the turn answers; routing is derived from it, never from the model."""
    session_id: int
    workspace: Path
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    turn_id: str = field(default_factory=new_id)
    services: TurnServices = field(default_factory=TurnServices)
    notes: TurnNotes = field(default_factory=TurnNotes)
    audience: Audience | None = None
    """What the speaker may see and do (``agent/trust.py``); None: the default policy's
    answer for the message's trust."""
    model: str | None = None
    """The alias (``agent.models.aliases``) this turn's model calls use; None: ``agent.model``
    (``agent/model_choice.py``)."""

    @property
    def access(self) -> Audience:
        """The turn's audience: its tools, the owner's files, whose memory."""
        return self.audience or DEFAULT_POLICY.audience(self.message)

    @property
    def session_key(self) -> str:
        return self.message.session_key

    @property
    def received_at(self) -> datetime:
        """The turn's clock: when its message arrived."""
        return self.message.received_at

    @property
    def reply_target(self) -> tuple[str, str] | None:
        """The chat this turn answers: the one it came from, or a system turn's target
        (None: a system turn with nowhere to deliver, e.g. ``heartbeat.target: none``)."""
        msg = self.message
        if msg.deliver_to is not None:
            return msg.deliver_to
        if msg.kind in ("cron", "heartbeat"):
            return None
        return (msg.channel, msg.chat_id)

    @property
    def reply_thread(self) -> str | None:
        """The thread of ``reply_target`` this turn answers in."""
        msg = self.message
        return msg.deliver_thread if msg.deliver_to is not None else (
            None if msg.kind in ("cron", "heartbeat") else msg.thread_id)
