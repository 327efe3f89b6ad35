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

from gateway.kernel.events import ChatActivity, MessageStage, OutboundMessage
from gateway.kernel.frozen import frozen
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


@frozen
class Shown:
    """What showing a reply's text so far did (``LiveReplies.show``)."""

    message_id: str | None = None
    """The platform message that shows it (None: a draft, which leaves nothing behind)."""
    retry_after: float | None = None
    """Rate limited: try again after this many seconds."""
    error: str | None = None
    """It failed otherwise; tried again at the next change."""


class LiveReplies(Protocol):
    """A channel that shows a reply while it is written (``channel.live``): the gateway's
    ``StreamDesk`` calls it, throttled, with the whole text so far each time."""

    async def show(self, target: OutboundMessage, text: str,
                   message_id: str | None) -> Shown:
        """Show ``text`` (markdown, possibly cut mid-answer) for the reply ``target``: a new
        message, a draft, or an edit of ``message_id`` (what an earlier ``show`` made, in
        this run or before a restart)."""
        ...

    async def finish(self, msg: OutboundMessage, message_id: str) -> Delivery:
        """Deliver the final ``msg`` into ``message_id``: its first part replaces what was
        shown, the rest is sent after it, as ``send`` would. Safe to call again after a
        failure: nothing is sent twice."""
        ...

    async def remove(self, target: OutboundMessage, message_id: str) -> None:
        """Take away what was shown: no answer follows (``/stop``)."""
        ...


@runtime_checkable
class Channel(Protocol):
    name: str
    hints: ChannelHints
    live: LiveReplies | None
    """Shows replies while they are written, when the channel's ``streaming`` is on."""
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
    live: LiveReplies | None = None

    def activity(self, event: ChatActivity) -> None:
        return None

    def react(self, event: MessageStage) -> None:
        """Show where a person's message is (a reaction), when the channel's
        ``streaming.reactions`` is on. Default: nothing. Must not block."""
        return None


@frozen(kw_only=True)
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
    """``data_dir``. Files people send go into the workspace's ``inbox/<channel>/<chat>/``
    (``gateway.kernel.inbox_files``), not here."""
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
