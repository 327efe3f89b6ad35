"""The protocol every channel adapter implements, and the shared pieces they use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gateway.events import OutboundMessage


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """What a channel did with one outbound message."""

    ok: bool
    message_ids: tuple[str, ...] = ()
    error: str | None = None
    retry_after: float | None = None
    permanent: bool = False
    """True when trying again cannot help (chat gone, bot blocked)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelHints:
    """What the agent is told about how its reply is shown."""

    markup: str = "plain text"
    max_length: int | None = None
    etiquette: str = ""

    def lines(self) -> list[str]:
        out = [f"Markup: {self.markup}"]
        if self.max_length:
            out.append(f"Message length limit: {self.max_length} characters "
                       "(longer replies are split)")
        if self.etiquette:
            out.append(f"Etiquette: {self.etiquette}")
        return out


@dataclass(slots=True)
class ChannelStatus:
    running: bool = False
    detail: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Channel(Protocol):
    name: str
    hints: ChannelHints

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, msg: OutboundMessage) -> Delivery: ...

    def status(self) -> ChannelStatus: ...
