"""The protocol every channel adapter implements, and the shared pieces they use.

``Channel`` is everything the gateway asks of an adapter, optional parts included: an adapter
that has no use for them subclasses ``ChannelBase`` for their defaults, so the gateway reads
them plainly instead of probing for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from gateway.kernel.events import ChatActivity, OutboundMessage
from gateway.kernel.values import ChannelHints, Delivery

if TYPE_CHECKING:
    from pydantic import BaseModel

    from gateway.kernel.bus import MessageBus
    from gateway.kernel.config import Config
    from gateway.kernel.store import Store


@dataclass(slots=True)
class ChannelStatus:
    running: bool = False
    detail: dict[str, object] = field(default_factory=dict)
    state: str | None = None
    """"connected", "degraded" or "down", from what completed (``common.Liveness``); None:
    the gateway derives it from ``running`` and ``detail["degraded"]``."""
    reason: str | None = None
    """Why the state is not "connected", in one line."""


@runtime_checkable
class Channel(Protocol):
    name: str
    hints: ChannelHints
    wants_progress: bool
    """Show progress lines (what a turn is doing) live; they are never retried. Default False:
    the gateway does not even queue them."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, msg: OutboundMessage) -> Delivery: ...

    def status(self) -> ChannelStatus: ...

    def activity(self, event: ChatActivity) -> None:
        """A turn in one of this channel's chats started or ended (``event.busy``), for a
        "typing…" indicator. Default: nothing. Must not block (it is called synchronously)."""
        ...


class ChannelBase:
    """The defaults of ``Channel``'s optional parts."""

    wants_progress: bool = False

    def activity(self, event: ChatActivity) -> None:
        return None


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
    monotonic: Callable[[], float] = time.monotonic
    """Seconds for watchdogs and health (``Liveness``); tests hand in a clock they move."""

    def section(self, name: str) -> Any:
        """``channels.<name>`` of the config: a built-in section, or a plugin channel's,
        validated against its ``config_model`` when the config was loaded."""
        return getattr(self.config.channels, name)


class ChannelPlugin(Protocol):
    """What the ``parley.channels`` entry point names: a channel class.

    Register it in the package's ``pyproject.toml``::

        [project.entry-points."parley.channels"]
        mychat = "mychat_parley:MyChatChannel"

    ``name`` is the entry point's name and the config key (``channels.mychat``);
    ``config_model`` is the pydantic model of that section (``enabled`` switches it on);
    ``from_deps`` builds the channel for the gateway (its section: ``deps.section(name)``).
    A chat platform's adapter converts each update into ``channels.incoming.Incoming`` and
    hands it to ``channels.inbound.Inbound.take()``: access, pairing, trust and group context
    come with it. ``parley.testing`` checks any channel against a fake of its platform.
    """

    name: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> Channel: ...
