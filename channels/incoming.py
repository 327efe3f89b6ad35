"""What a chat platform's adapter hands the shared inbound pipeline (``channels.inbound``).

An adapter converts each platform update into an ``Incoming``: plain, neutral data, decided
where only the platform can decide it (who the message addressed, what the agent reads, which
session it belongs to, which files came with it). Everything after that — access, pairing,
group context, attachment limits, publishing — happens once, in shared code, for every
platform. Besides its conversion, an adapter supplies the two calls the pipeline makes on its
platform (``PlatformIO``: download a file, post a notice) and the few texts it words its own
way (``Wording``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from gateway.kernel.events import InboundMessage, Media, MediaKind, Trust
from gateway.kernel.frozen import frozen


@frozen(kw_only=True)
class Sender:
    id: str
    name: str
    """The display name the agent and the owner see."""
    first_name: str | None = None
    """What a pairing reply greets them with, when the platform has it (Telegram)."""
    is_bot: bool = False
    handle: str | None = None
    """A user name an allow list may give instead of the id (Telegram's ``@username``)."""


@frozen(kw_only=True)
class Attachment:
    """A file that came with a message, before it is downloaded."""

    source: str
    """What the adapter downloads it by: Telegram's file id, Discord's CDN URL."""
    kind: MediaKind
    mime: str | None
    size: int | None
    """In bytes; None when the platform did not say (then it is checked after download)."""
    label: str
    """How texts name it: ``photo`` or ``document "a.pdf"`` (Telegram), ``a.pdf`` (Discord)."""
    name: str | None = None


@frozen(kw_only=True)
class Incoming:
    """One platform message, converted. ``where`` and ``id`` are the reply-capable reference:
    notices (a pairing code, a refused file) go to ``where``, quoting ``id``."""

    platform: str
    id: str
    where: str
    """The chat or channel it was posted in (a Discord thread's own id)."""
    chat_id: str
    """The session's chat: the Telegram chat, the Discord channel (a thread's parent)."""
    thread_id: str | None = None
    """A Telegram forum topic or a Discord thread: a session of its own."""
    guild_id: str | None = None
    """The Discord server; None elsewhere and in direct messages."""
    place_ids: tuple[str, ...] = ()
    """What an allow list of places may name it by: the chat id and ``@name`` (Telegram), the
    channel and a thread's parent (Discord)."""
    direct: bool
    sender: Sender
    addressed: bool
    """It reached for the bot: always in a direct chat; in a group a mention, a reply to the
    bot or one of its commands."""
    text: str
    """What the agent reads (the bot's mention removed, what it replies to quoted)."""
    attachments: tuple[Attachment, ...] = ()
    reply_to: str | None = None
    received_at: datetime


def to_inbound(inc: Incoming, *, text: str, media: tuple[Media, ...] = (),
               mentioned: bool = False, context_only: bool = False,
               trust: Trust = "guest") -> InboundMessage:
    return InboundMessage(
        channel=inc.platform, chat_id=inc.chat_id, sender_id=inc.sender.id,
        sender_name=inc.sender.name, text=text, media=media, message_id=inc.id,
        thread_id=inc.thread_id, chat_type="direct" if inc.direct else "group",
        mentioned=mentioned, reply_to=inc.reply_to, received_at=inc.received_at,
        kind="command" if text.startswith("/") else "user", context_only=context_only,
        trust=trust, server_id=inc.guild_id)


# --- what the adapter supplies ------------------------------------------------------------------

class DownloadFailed(Exception):
    """The platform could not hand over a file; the message says why, with no secret in it."""


@frozen
class Fetched:
    data: bytes
    name: str
    """The file name to store it under (unique, safe on any system)."""


class PlatformIO(Protocol):
    async def fetch(self, inc: Incoming, index: int, att: Attachment,
                    limit: int) -> Fetched | None:
        """The ``index``-th attachment's bytes; None when it turns out to be over ``limit``;
        ``DownloadFailed`` when the platform or the network fails."""
        ...

    async def notice(self, inc: Incoming, text: str, *, reply: bool) -> None:
        """Post a plain message from the channel itself where ``inc`` was posted (quoting it
        when ``reply``, where the platform quotes); best effort, never raises."""
        ...


@frozen(kw_only=True)
class Wording:
    """The texts each platform words its own way. Templates take ``{label}`` (an attachment's
    label), ``{size}`` and ``{limit}`` (as ``human_size`` shows them)."""

    title: str
    """The platform as users name it: ``Telegram``."""
    place: str
    """What log lines call a place: ``chat``, ``channel``."""
    command: str
    """How a command to type is shown: ``{}``, or ``` `{}` ``` where markdown shows code."""
    context_mark: str
    """An attachment in group chatter kept as context: ``[{label}]``."""
    failed_note: str
    """For the agent, when a file could not be downloaded."""
    too_big_note: str
    """For the agent, when a file is over the limit."""
    too_big_reply: Callable[[Sequence[Attachment], int], str]
    """For the user, naming the refused files and the limit."""


def human_size(size: int) -> str:
    """``512 bytes``, ``2 KB``, ``20 MB``, ``25.3 MB``."""
    if size < 1024:
        return f"{size} bytes"
    value, unit = (size / 1024, "KB") if size < 1024 * 1024 else (size / 1024 / 1024, "MB")
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


def size_of(att: Attachment) -> str:
    return human_size(att.size) if att.size else "unknown size"
