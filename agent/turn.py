"""What one agent turn knows, in one typed object.

Routing (which chat a reply or a scheduled job goes to) is read from here, never from the
model's tool arguments, so one session can never write into another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config import ToolsConfig
from gateway.events import ChatType, InboundKind, new_id

if TYPE_CHECKING:
    from channels.base import Delivery
    from gateway.events import OutboundMessage


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
    turn_id: str = field(default_factory=new_id)
    services: TurnServices = field(default_factory=TurnServices)
