"""The one inbound pipeline: a converted platform message → access → pairing, context, or
messages stored on the bus. Every chat platform goes through it; an adapter only converts
(``channels.incoming``) and says how to fetch a file and post a notice on its platform.

Group messages the bot does not answer wait in memory (at most ``group_history`` per chat or
thread) and go to the bus as context-only messages right before the next message it answers
there, so the agent sees what was said when it is addressed. Attachments are saved inside the
workspace, under ``inbox/<channel>/<chat>/`` (``gateway.kernel.inbox_files``), where the agent's
file tools open them: one over ``max_media_bytes`` gets a polite refusal in the chat and a note
for the agent instead. Storing a message on the bus is tried a few times; one that could not be
stored is not acknowledged to the platform (the transport leaves it for a later try), never
dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable
from datetime import datetime
from pathlib import Path

from channels.access import Access, AccessRules
from channels.incoming import (
    Attachment,
    DownloadFailed,
    Incoming,
    PlatformIO,
    Wording,
    human_size,
    size_of,
    to_inbound,
)
from gateway.kernel.backoff import BackoffPolicy
from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.events import InboundMessage, Media, utcnow
from gateway.kernel.inbox_files import inbox_path, save_file
from gateway.kernel.pairing import PairingFull, PairingStore

_log = logging.getLogger(__name__)

MAX_CONTEXT_CHATS = 500
PUBLISH_ATTEMPTS = 5
PAIRING_FULL = ("Hi! This bot only talks to people its owner approved, and several requests "
                "are already waiting. Please try again in an hour.")


class GroupContext:
    """Group messages not addressed to the bot, kept (the last ``per_chat`` per chat or
    thread, for at most ``max_chats`` chats) until the next addressed message, which takes
    them along as context-only history."""

    def __init__(self, per_chat: int, max_chats: int) -> None:
        self.per_chat = per_chat
        self.max_chats = max_chats
        self._kept: OrderedDict[tuple[str, str | None], deque[InboundMessage]] = OrderedDict()

    def keep(self, msg: InboundMessage) -> None:
        key = (msg.chat_id, msg.thread_id)
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = deque(maxlen=self.per_chat)
            while len(self._kept) > self.max_chats:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        kept.append(msg)

    def with_context(self, msg: InboundMessage) -> list[InboundMessage]:
        """What to publish for an addressed message: the kept context first, then it."""
        return [*self._kept.pop((msg.chat_id, msg.thread_id), ()), msg]


class Inbound:
    def __init__(self, platform: str, io: PlatformIO, wording: Wording, *, bus: MessageBus,
                 pairing: PairingStore, rules: AccessRules, workspace: Path,
                 max_media_bytes: int, allow_bots: bool = False,
                 retry: BackoffPolicy | None = None) -> None:
        """``workspace``: files go to its ``inbox/<channel>/<chat>/``; ``allow_bots``: other
        bots' messages are handled too (else dropped unseen); ``retry``: the waits between tries
        to store a message."""
        self.platform = platform
        self.access = Access(platform, rules, pairing)
        self._io = io
        self._wording = wording
        self._bus = bus
        self._pairing = pairing
        self._workspace = workspace
        self._limit = max_media_bytes
        self._allow_bots = allow_bots
        self._retry = retry or BackoffPolicy()
        self._context = GroupContext(rules.group_history, MAX_CONTEXT_CHATS)
        self.last_inbound: datetime | None = None

    @property
    def closed(self) -> bool:
        """The bus takes nothing more (the gateway is stopping)."""
        return self._bus.closed

    async def take(self, convert: Awaitable[Incoming | None], what: str) -> bool:
        """Convert, prepare and store one platform message (``what`` names it in the log).

        A message that cannot be converted or prepared (our bug, or something we cannot read)
        is logged and skipped, so a transport never loops on it. False when the bus is closed
        (the gateway is stopping) or the message could not be stored: the transport must not
        confirm it as handled, so the platform keeps it for a later try.
        """
        try:
            inc = await convert
            ready = await self.prepare(inc) if inc is not None else []
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("%s: could not handle %s", self.platform, what)
            ready = []
        for msg in ready:
            if not await self._publish(msg):
                return False
        if ready:
            self.last_inbound = utcnow()
        return True

    async def prepare(self, inc: Incoming) -> list[InboundMessage]:
        """The messages to publish for ``inc``, context first; [] when none."""
        if inc.sender.is_bot and not self._allow_bots:
            return []
        verdict = await self.access.verdict(inc)
        if verdict == "ignore":
            _log.info("%s: ignored a message from user %s in %s %s (not allowed by "
                      "channels.%s access settings)", self.platform, inc.sender.id,
                      self._wording.place, inc.where, self.platform)
            return []
        if verdict == "pair":
            await self._pairing_reply(inc)
            return []
        if verdict == "context":
            marks = (self._wording.context_mark.format(label=a.label) for a in inc.attachments)
            shown = "\n".join(filter(None, (inc.text, *marks)))
            if shown:
                self._context.keep(to_inbound(inc, text=shown, context_only=True,
                                              trust="guest"))
            return []
        media, text = await self._attachments(inc)
        if not text and not media:
            return []
        msg = to_inbound(inc, text=text, media=media, mentioned=inc.addressed and not inc.direct,
                         trust=await self.access.trust(inc.sender))
        return self._context.with_context(msg)

    async def _publish(self, msg: InboundMessage) -> bool:
        """Store the message (a few tries); False when the bus is closed or it could not be
        stored — never acknowledged then, so the platform offers it again."""
        backoff = self._retry.counter()
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                await self._bus.publish_inbound(msg)
                return True
            except BusClosed:
                return False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == PUBLISH_ATTEMPTS:
                    _log.error("%s: message %s not stored after %d attempts (%s); not "
                               "acknowledged, so %s offers it again", self.platform,
                               msg.message_id, attempt, exc, self._wording.title)
                    break
                delay = backoff.next()
                _log.warning("%s: message %s not stored (%s); retry in %.1fs", self.platform,
                             msg.message_id, exc, delay)
                await asyncio.sleep(delay)
        return False

    async def _pairing_reply(self, inc: Incoming) -> None:
        sender, wording = inc.sender, self._wording
        try:
            code = await self._pairing.request(self.platform, sender.id, user_name=sender.name,
                                               chat_id=inc.where)
        except PairingFull:
            text = PAIRING_FULL
        else:
            if code.new:
                _log.info("%s: pairing code %s issued to %s (id %s)", self.platform, code.code,
                          sender.name, sender.id)
            approve = wording.command.format(f"parley pairing approve {self.platform} {code.code}")
            text = (f"Hi {sender.first_name or sender.name}! I only talk to people my owner "
                    f"approved.\n\nYour pairing code: {code.code}\n\n"
                    f"Send it to my owner, who approves it with:\n{approve}\n\n"
                    f"The code is valid for one hour. Your {wording.title} user id is "
                    f"{sender.id}.")
        await self._io.notice(inc, text, reply=False)

    async def _attachments(self, inc: Incoming) -> tuple[tuple[Media, ...], str]:
        """Files saved in the chat's inbox folder, and the text with a note for each one that
        was not.

        A file over the cap is refused politely in the chat; when nothing but such refusals is
        left, there is no message at all (the user was told). A file that could not be
        downloaded is only noted, so the agent can say so.
        """
        limit, wording = self._limit, self._wording
        media: list[Media] = []
        notes: list[str] = []
        refused: list[Attachment] = []
        failed = False
        for index, att in enumerate(inc.attachments):
            try:
                fetched = None if att.size is not None and att.size > limit else \
                    await self._io.fetch(inc, index, att, limit)
            except DownloadFailed as exc:
                _log.warning("%s: could not download %s: %s", self.platform, att.label, exc)
                notes.append(wording.failed_note.format(label=att.label))
                failed = True
                continue
            if fetched is None or len(fetched.data) > limit:
                refused.append(att)
                notes.append(wording.too_big_note.format(label=att.label, size=size_of(att),
                                                         limit=human_size(limit)))
                continue
            folder = inbox_path(self._workspace, self.platform, inc.chat_id)
            path = await asyncio.to_thread(save_file, folder, fetched.name, fetched.data)
            media.append(Media(kind=att.kind, path=str(path), mime=att.mime,
                               size=len(fetched.data)))
        if refused:
            await self._io.notice(inc, wording.too_big_reply(refused, limit), reply=True)
        if not (inc.text or media or failed):
            return (), ""
        return tuple(media), "\n".join(filter(None, (inc.text, *notes)))
