"""What one agent turn knows, in one typed object.

Routing (which chat a reply or a scheduled job goes to) is read from here, never from the
model's tool arguments, so one session can never write into another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gateway.config import ToolsConfig
from gateway.events import ChatType, InboundKind, new_id


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
