"""Where an answer goes, and answers that are not a model turn (commands, errors).

An answer goes back to the chat its message came from, or to a system turn's target
(``deliver_to``): the routing is read from the inbound message, never from the model. Its
idempotency key is made from that message, so a reply stored twice is sent once.
"""

from __future__ import annotations

from datetime import datetime

from gateway.kernel.bus import MessageBus
from gateway.kernel.events import InboundMessage, OutboundKind, OutboundMessage
from gateway.kernel.secrets import SECRETS
from gateway.kernel.store import Store


def nowhere(msg: InboundMessage) -> bool:
    """A scheduled turn without a target (``heartbeat.target: none``): nothing is sent."""
    return msg.kind in ("cron", "heartbeat") and msg.deliver_to is None


def outbound(msg: InboundMessage, text: str, kind: OutboundKind, turn_id: str | None = None,
             key: str | None = None, stream: str | None = None) -> OutboundMessage:
    """The answer to ``msg``; ``key`` tells apart several answers of one kind (progress);
    ``stream``: the live reply it ends, or opens."""
    system = msg.deliver_to is not None
    channel, chat_id = msg.deliver_to or (msg.channel, msg.chat_id)
    if kind == "reply" and msg.kind in ("cron", "heartbeat"):
        kind = msg.kind  # a scheduled answer is marked as such for the channel
    return OutboundMessage(
        channel=channel, chat_id=chat_id, text=SECRETS.redact(text), kind=kind,
        reply_to=None if system else msg.message_id,
        thread_id=msg.deliver_thread if system else msg.thread_id, turn_id=turn_id,
        stream=stream,
        idempotency_key=f"{msg.channel}:{msg.chat_id}:{msg.message_id}:{kind}:{key or ''}")


class Replies:
    def __init__(self, store: Store, bus: MessageBus) -> None:
        self.store = store
        self.bus = bus

    def outbox(self, reply: OutboundMessage) -> list[tuple[OutboundMessage, datetime]]:
        """``reply`` as an outbox entry, to store in the transaction that ends a turn."""
        return [(reply, self.bus.expires_at(reply))]

    async def answer(self, sources: list[InboundMessage], msg: InboundMessage, text: str, *,
                     kind: OutboundKind) -> None:
        """A reply that is not a model turn (commands, errors): stored with its inbox
        entries marked answered, in one transaction, then sent."""
        reply = outbound(msg, text, kind)
        if nowhere(msg):
            await self.store.finish_inbound(sources, [])
            return
        await self.store.finish_inbound(sources, self.outbox(reply))
        await self.bus.publish_outbound(reply, stored=True)
