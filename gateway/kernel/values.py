"""Value types the channels and the agent exchange through the composition root.

A channel reports a ``Delivery`` for each message it sends and describes how it shows text with
``ChannelHints``; the agent reads the hints into the runtime block and the delivery results
through the message tool. ``COMMAND_DESCRIPTIONS`` is what channels put in their command menus
(the agent answers the commands).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.kernel.frozen import frozen


@frozen(kw_only=True)
class Delivery:
    """What a channel did with one outbound message."""

    ok: bool
    message_ids: tuple[str, ...] = ()
    error: str | None = None
    retry_after: float | None = None
    permanent: bool = False
    """True when trying again cannot help (chat gone, bot blocked)."""
    unknown: bool = False
    """The platform may have the message: the request went out, but no readable answer came
    back (a timeout after sending, a connection lost while waiting). The delivery workers
    resend such a message at most once, and say so, rather than until it is delivered."""
    recorded: bool = False
    """The channel marked the message's outbox row delivered in the write that stored it
    (``OutboxMark``, a channel whose sending is a database write): nothing is left to record."""


@frozen
class OutboxMark:
    """What a channel that sends by writing to the gateway's database (the local channel's
    reply log, WebChat's log: their ``send_marked``) records in that same transaction: the
    outbox row ``key`` delivered after ``attempts`` tries (``store_queues.mark_delivered``).
    One commit where there were two, and no window between the reply stored and its outbox
    row still pending."""

    key: str
    attempts: int


class TurnSend:
    """A reply sent in the write of the turn that made it (``Store.save_turn``'s ``sent``):
    offered by a channel whose sending is itself a write to the gateway's database (the local
    channel's reply log, WebChat's log), taken by the delivery side only when nothing is ahead
    of the reply in its chat (``ChannelManager.send_with_turn``). The turn, its outbox row
    (stored delivered) and the channel's record land in one commit; the delivery worker, its
    write and its outbox update are not needed.

    ``write(db)`` runs inside that transaction (again, should the group commit's batch be
    rolled back and run alone); ``settle()`` runs once it committed (``done()``, called by the
    store, even when the turn was cancelled meanwhile), with what ``write`` returned last: it
    shows the reply (wakes the chat's readers) and says how it went."""

    __slots__ = ("key", "write", "settle", "result")

    def __init__(self, key: str, write: Callable[[Any], Any],
                 settle: Callable[[Any], Delivery]) -> None:
        self.key = key
        """The reply's idempotency key: its outbox row is the one stored delivered."""
        self.write = write
        self.settle = settle
        self.result: Any = None

    def run(self, db: Any) -> None:
        """(Inside the turn's transaction.)"""
        self.result = self.write(db)

    def done(self) -> Delivery:
        """(After the commit.)"""
        return self.settle(self.result)


@frozen(kw_only=True)
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


COMMAND_DESCRIPTIONS: dict[str, str] = {
    "new": "start a fresh conversation (the old one stays saved)",
    "stop": "stop the running answer at once (what you sent is kept)",
    "compact": "summarise the older part of the conversation now (/compact [focus])",
    "status": "model, session, message count and context size",
    "usage": "your model calls, tokens and cost (today and in all)",
    "model": "the model of this conversation: /model lists, /model <name> switches",
    "help": "list the commands",
}
"""What channels show in their command menus (Telegram's setMyCommands, ...)."""
