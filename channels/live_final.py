"""The final of a streamed reply, put into the message that showed it: the one procedure
Telegram and Discord share (``LiveReplies.finish``).

Its first part is edited into the shown message once, recorded as sent part 0 in
``SentParts``, and the channel's usual send delivers the rest (it resumes after part 0), so a
retry never sends a part twice. A shown message deleted meanwhile gets the reply sent whole;
an edit the platform refuses for good, or a reply whose first part is not text, is sent whole
and the shown message then taken away: never no answer, never two.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from channels.sent_parts import SentParts
from gateway.kernel.events import OutboundMessage
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)

Edited = Literal["done", "gone", "refused"] | Delivery
"""What the final edit did: ``done`` (or already so), ``gone`` (no such message any more),
``refused`` for good, or a failed ``Delivery`` to retry as it says."""


async def finish_into(msg: OutboundMessage, message_id: str, *, first_is_text: bool,
                      sent: SentParts, edit: Callable[[], Awaitable[Edited]],
                      send: Callable[[OutboundMessage], Awaitable[Delivery]],
                      remove: Callable[[OutboundMessage, str], Awaitable[None]]) -> Delivery:
    async def instead() -> Delivery:
        delivery = await send(msg)
        if delivery.ok:
            await remove(msg, message_id)
        return delivery

    if not first_is_text:  # nothing to put in its place
        return await instead()
    if not await sent.sent(msg.idempotency_key):
        result = await edit()
        if isinstance(result, Delivery):
            return result
        if result == "gone":
            return await send(msg)
        if result == "refused":
            _log.warning("%s: the final edit was refused; the reply is sent as new messages",
                         msg.channel)
            return await instead()
        await sent.record(msg.idempotency_key, 0, message_id, msg.chat_id)
    return await send(msg)
