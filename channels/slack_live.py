"""Slack replies shown while they are written (``channels.slack.streaming``): one message
posted, then updated in place (``chat.update``); the final's first part is put into it
(``live_final.finish_into``, exactly once), the rest of a long answer posted after it.

Each update is the whole text so far with an open code fence closed (``interim_markdown``),
cut into parts and rendered to mrkdwn the way a reply is (``slack_convert.plan_parts``), so a
fence or an escape is never cut mid-update; an answer past one message shows its latest part
while it grows. A 429 (Slack's ``Retry-After``) goes back to the gateway's desk, which waits
it out on its clock. The shown message is taken away with ``chat.delete`` when no answer
follows (``/stop``).

Reactions (``channels.reactions``): with ``streaming.reactions`` every stage of a message
shows (``FULL``); otherwise, with ``channels.slack.reactions`` (on by default), 👀 while its
turn runs and nothing after (``WHILE_RUNNING``), as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import Shown
from channels.live_final import Edited, finish_into
from channels.sent_parts import SentParts
from channels.slack_convert import plan_parts
from channels.slack_outbound import Outbound
from gateway.kernel.events import MessageStage, OutboundMessage, Stage
from gateway.kernel.streams import interim_markdown
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)

FULL: Mapping[Stage, str] = {"taken": "eyes", "queued": "hourglass_flowing_sand",
                             "done": "white_check_mark", "failed": "x"}
WHILE_RUNNING: Mapping[Stage, str] = {"taken": "eyes", "queued": "eyes", "done": "",
                                      "failed": ""}
"""Today's default: 👀 while the turn runs, taken away at its end ('' shows nothing)."""
ERRORS = (SlackClientError, aiohttp.ClientError, OSError, TimeoutError)
GONE = frozenset({"message_not_found", "channel_not_found"})


def _error(exc: BaseException) -> str | None:
    return str(exc.response.get("error") or "") if isinstance(exc, SlackApiError) else None


class SlackLive:
    def __init__(self, web: Callable[[], AsyncWebClient | None], outbound: Outbound,
                 sent: SentParts) -> None:
        self._web = web
        self._outbound = outbound
        self._sent = sent

    async def show(self, target: OutboundMessage, text: str,
                   message_id: str | None) -> Shown:
        web = self._web()
        if web is None:
            return Shown(message_id=message_id, error="not connected to Slack yet")
        parts = [p for p in plan_parts(interim_markdown(text), ()) if isinstance(p, str)]
        if not parts:
            return Shown(message_id=message_id)
        try:
            if message_id is None:
                return Shown(message_id=await self._outbound.post(web, target, parts[-1]))
            await web.chat_update(channel=target.chat_id, ts=message_id, text=parts[-1])
            return Shown(message_id=message_id)
        except ERRORS as exc:
            if _error(exc) in GONE:  # deleted meanwhile: the next update starts anew
                return Shown(message_id=None, error="the shown message is gone")
            delivery = self._outbound.failure(exc)
            return Shown(message_id=message_id, retry_after=delivery.retry_after,
                         error=None if delivery.retry_after is not None else delivery.error)

    async def finish(self, msg: OutboundMessage, message_id: str) -> Delivery:
        """The final's first part put into the shown message (``finish_into``)."""
        parts = plan_parts(msg.text, msg.media)
        first = parts[0] if parts else None

        async def edit() -> Edited:
            web = self._web()
            if web is None:
                return Delivery(ok=False, error="not connected to Slack yet", retry_after=5.0)
            try:
                await web.chat_update(channel=msg.chat_id, ts=message_id, text=str(first))
            except ERRORS as exc:
                if _error(exc) in GONE:
                    return "gone"
                delivery = self._outbound.failure(exc)
                return "refused" if delivery.permanent or _error(exc) in (
                    "cant_update_message", "edit_window_closed") else delivery
            return "done"

        return await finish_into(msg, message_id, first_is_text=isinstance(first, str),
                                 sent=self._sent, edit=edit, send=self._outbound.send,
                                 remove=self.remove)

    async def remove(self, target: OutboundMessage, message_id: str) -> None:
        web = self._web()
        if web is None:
            return
        try:
            await web.chat_delete(channel=target.chat_id, ts=message_id)
        except ERRORS as exc:
            _log.info("slack: could not remove a shown reply: %s",
                      self._outbound.clean(str(exc)))

    async def reaction(self, event: MessageStage, emoji: str, previous: str | None) -> None:
        """``emoji`` on the message in place of ``previous`` ('' shows nothing); raises on
        failure (``Reactions`` logs it)."""
        web = self._web()
        if web is None:
            return
        if emoji:
            await web.reactions_add(channel=event.chat_id, timestamp=event.message_id,
                                    name=emoji)
        if previous:
            await web.reactions_remove(channel=event.chat_id, timestamp=event.message_id,
                                       name=previous)
