"""Slack output over the Web API (slack-sdk's ``AsyncWebClient``): replies cut into mrkdwn parts
and sent in order, files uploaded; and the two calls the shared inbound pipeline
makes on Slack (``PlatformIO``): notices and downloading a shared file with the bot token.

Every part Slack accepted is recorded in ``SentParts`` before the next is sent, so a retry of
the same ``OutboundMessage`` resumes at the first part not yet delivered. Slack's 429 answers
``Delivery.retry_after`` with its ``Retry-After``; an error that another try cannot mend
(``channel_not_found``, ``not_in_channel``, a revoked token…) is permanent; a post whose answer
never came back (the connection dropped after sending) is ``unknown``. The client itself never
retries (``retry_handlers=[]``): the outbox does, once, with the kernel's backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from channels.common import read_small, redact
from channels.incoming import Attachment, DownloadFailed, Fetched, Incoming, human_size
from channels.sent_parts import SentParts
from channels.slack_convert import plan_parts, stored_name
from gateway.kernel.events import Media, OutboundMessage, utcnow
from gateway.kernel.values import Delivery

_log = logging.getLogger(__name__)

PERMANENT = frozenset({"channel_not_found", "not_in_channel", "is_archived", "msg_too_long",
                       "no_text", "invalid_auth", "account_inactive", "token_revoked",
                       "not_authed", "restricted_action", "user_not_found",
                       "cannot_dm_bot", "missing_scope", "invalid_blocks"})
NOT_SENT = (aiohttp.ClientConnectorError,)
"""Failures before the request went out: no doubt that nothing was posted."""


class Outbound:
    def __init__(self, web: Callable[[], AsyncWebClient | None], sent: SentParts, *,
                 bot_token: str, app_token: str, max_media_bytes: int) -> None:
        """``web()``: the Web API client, or None before the channel started."""
        self._web = web
        self._sent = sent
        self._token = bot_token
        self._secrets = (bot_token, app_token)
        self._limit = max_media_bytes
        self._session: aiohttp.ClientSession | None = None
        self.last_send_ok: datetime | None = None

    def open(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def clean(self, text: str) -> str:
        return redact(text, self._secrets)

    def failure(self, exc: Exception) -> Delivery:
        """What a failed Web API call means for the message."""
        if isinstance(exc, SlackApiError):
            status = exc.response.status_code
            error = str(exc.response.get("error") or f"HTTP {status}")
            if status == 429 or error == "ratelimited":
                after = exc.response.headers.get("Retry-After") or \
                    exc.response.headers.get("retry-after") or "1"
                return Delivery(ok=False, error=f"rate limited ({error})",
                                retry_after=float(after))
            return Delivery(ok=False, error=self.clean(error), permanent=error in PERMANENT)
        if isinstance(exc, NOT_SENT):
            return Delivery(ok=False, error=self.clean(f"cannot reach Slack: {exc}"))
        return Delivery(ok=False, unknown=True,
                        error=self.clean(f"no answer from Slack: {type(exc).__name__}: {exc}"))

    async def send(self, msg: OutboundMessage) -> Delivery:
        if msg.kind == "progress" or (not msg.text.strip() and not msg.media):
            return Delivery(ok=True)
        web = self._web()
        if web is None:
            return Delivery(ok=False, error="not connected to Slack yet", retry_after=5.0)
        key = msg.idempotency_key
        done = await self._sent.sent(key)
        parts = plan_parts(msg.text, msg.media)
        for index in range(len(done), len(parts)):
            part = parts[index]
            try:
                ts = await (self.post(web, msg, part) if isinstance(part, str)
                            else self._upload(web, msg, part))
            except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                delivery = self.failure(exc)
                _log.warning("slack: part %d/%d to %s failed: %s", index + 1, len(parts),
                             msg.chat_id, delivery.error)
                return delivery
            await self._sent.record(key, index, ts, msg.chat_id)
            done.append(ts)
            self.last_send_ok = utcnow()
        return Delivery(ok=True, message_ids=tuple(done))

    async def post(self, web: AsyncWebClient, msg: OutboundMessage, text: str) -> str:
        """One text part posted (raises what the Web API raised); its ``ts``."""
        answer = await web.chat_postMessage(channel=msg.chat_id, text=text,
                                            thread_ts=msg.thread_id, mrkdwn=True,
                                            unfurl_links=False)
        return str(answer.get("ts") or "")

    async def _upload(self, web: AsyncWebClient, msg: OutboundMessage, media: Media) -> str:
        if media.url is not None:  # Slack unfurls a link itself
            return await self.post(web, msg, f"<{media.url}>")
        path = Path(media.path or "")
        data = await asyncio.to_thread(read_small, path, self._limit)
        if isinstance(data, bytes):
            answer = await web.files_upload_v2(channel=msg.chat_id, thread_ts=msg.thread_id,
                                               content=data, filename=path.name,
                                               title=path.name)
            files = answer.get("files") or [{}]
            return str(files[0].get("id") or "")
        problem = "not found" if data is None else f"too big to send (over " \
                                                   f"{human_size(self._limit)})"
        return await self.post(web, msg, f"(Could not attach {path.name}: {problem}.)")

    # --- PlatformIO -----------------------------------------------------------------------------

    async def notice(self, inc: Incoming, text: str, *, reply: bool) -> None:
        """A plain message from the channel itself (pairing, refusals): best effort."""
        web = self._web()
        if web is None:
            return
        thread = inc.thread_id or (inc.id if reply and not inc.direct else None)
        try:
            await web.chat_postMessage(channel=inc.where, text=text, thread_ts=thread)
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            _log.warning("slack: notice to %s failed: %s", inc.where, self.clean(str(exc)))

    async def fetch(self, inc: Incoming, index: int, att: Attachment,
                    limit: int) -> Fetched | None:
        """A shared file's bytes, downloaded with the bot token (Slack's file URLs are
        private); None when it turns out to be over ``limit``."""
        if self._session is None:
            raise DownloadFailed("the Slack channel is not running")
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            async with self._session.get(att.source, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=120)) as resp:
                if resp.status != 200:
                    raise DownloadFailed(f"Slack answered HTTP {resp.status}")
                if resp.content_type == "text/html":
                    raise DownloadFailed("Slack answered a sign-in page: the bot token lacks "
                                         "the files:read scope")
                data = bytearray()
                async for piece in resp.content.iter_chunked(256 * 1024):
                    data += piece
                    if len(data) > limit:
                        return None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DownloadFailed(self.clean(f"{type(exc).__name__}: {exc}")) from exc
        return Fetched(bytes(data), stored_name(inc.id, index, att.name or att.label))
