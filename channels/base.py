"""The protocol every channel adapter implements, and the shared pieces they use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gateway.kernel.events import OutboundMessage
from gateway.kernel.values import ChannelHints, Delivery

if TYPE_CHECKING:
    from gateway.kernel.bus import MessageBus
    from gateway.kernel.config import Config
    from gateway.kernel.store import Store


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelDeps:
    """What the gateway hands a channel factory: ``create(deps) -> Channel``.

    A channel module that the gateway starts from config (``channels.<name>.enabled``) exposes
    ``create(deps: ChannelDeps) -> Channel``. Inbound messages go to ``bus.publish_inbound``
    (which stores them before returning), with ``message_id`` set to the platform's own id;
    replies arrive through ``Channel.send``, called by the gateway's delivery workers, which
    retry on ``Delivery(ok=False, retry_after=...)``.
    """

    config: Config
    bus: MessageBus
    store: Store
    data_path: Path
    """``data_dir``: channels keep downloaded media under ``data_path / "media" / <name>``."""
    health: Callable[[], dict[str, Any]]
