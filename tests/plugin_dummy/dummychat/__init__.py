"""A channel plugin, as a third party would write one: a chat platform that lives in memory
(``DummyPlatform``, one per ``channels.dummychat.platform`` name), its config model, and an
adapter that converts each update into an ``Incoming`` and hands it to the shared inbound
pipeline — access, pairing, trust and group context come with it. ``dummychat.fake`` is the
fake of the platform the contract kit drives."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from channels.access import AccessRules
from channels.base import ChannelBase, ChannelDeps, ChannelStatus
from channels.chunking import chunk_markdown
from channels.inbound import Inbound
from channels.incoming import (
    Attachment,
    DownloadFailed,
    Fetched,
    Incoming,
    Sender,
    Wording,
)
from gateway.kernel.events import OutboundMessage, utcnow
from gateway.kernel.pairing import PairingStore
from gateway.kernel.values import ChannelHints, Delivery

NAME = "dummychat"


class DummyPlatform:
    """The platform: updates users sent, and every post in each chat."""

    def __init__(self) -> None:
        self.updates: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        self.posts: dict[str, list[str]] = defaultdict(list)
        self.changed = asyncio.Event()
        self.handled: set[str] = set()
        self.refuse = False
        self._ids = 0

    def next_id(self) -> str:
        self._ids += 1
        return str(self._ids)

    def post(self, chat: str, text: str) -> None:
        self.posts[chat].append(text)
        self.changed.set()


PLATFORMS: dict[str, DummyPlatform] = {}


class DummyChatConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    platform: str = "default"
    allow_from: list[str] = Field(default_factory=list)
    dm_policy: Literal["pairing", "allowlist", "open", "disabled"] = "pairing"
    max_length: int = Field(300, gt=20)


WORDING = Wording(title="DummyChat", place="chat", command="{}", context_mark="[{label}]",
                  failed_note="[{label} could not be downloaded]",
                  too_big_note="[{label}: {size}, over {limit}]",
                  too_big_reply=lambda atts, limit: "Too big.")


class DummyChannel(ChannelBase):
    name = NAME
    config_model = DummyChatConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> DummyChannel:
        return cls(deps.section(NAME), deps)

    def __init__(self, config: DummyChatConfig, deps: ChannelDeps) -> None:
        self.config = config
        self.hints = ChannelHints(markup="plain text", max_length=config.max_length)
        self.platform = PLATFORMS.setdefault(config.platform, DummyPlatform())
        rules = AccessRules.of(dm_policy=config.dm_policy, group_policy="mention",
                               group_history=0, allow_from=config.allow_from)
        self.inbound = Inbound(NAME, self, WORDING, bus=deps.bus,
                               pairing=PairingStore(deps.store), rules=rules,
                               workspace=deps.config.workspace_path,
                               max_media_bytes=1024 * 1024)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._read(), name="dummychat-read")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=self._task is not None and not self._task.done())

    async def _read(self) -> None:
        while True:
            update_id, user, text = await self.platform.updates.get()
            await self.inbound.take(self._convert(update_id, user, text), f"update {update_id}")
            self.platform.handled.add(update_id)
            self.platform.changed.set()

    async def _convert(self, update_id: str, user: str, text: str) -> Incoming:
        chat = f"dm-{user}"
        return Incoming(platform=NAME, id=update_id, where=chat, chat_id=chat, direct=True,
                        sender=Sender(id=user, name=f"user {user}"), addressed=True,
                        text=text, received_at=utcnow())

    async def send(self, msg: OutboundMessage) -> Delivery:
        if self.platform.refuse:
            return Delivery(ok=False, error="the platform refused the message")
        parts = chunk_markdown(msg.text, self.config.max_length)
        for part in parts:
            self.platform.post(msg.chat_id, part)
        return Delivery(ok=True, message_ids=tuple(str(i) for i in range(len(parts))))

    # PlatformIO: what the shared pipeline asks of the platform
    async def fetch(self, inc: Incoming, index: int, att: Attachment,
                    limit: int) -> Fetched | None:
        raise DownloadFailed("DummyChat has no files")

    async def notice(self, inc: Incoming, text: str, *, reply: bool) -> None:
        self.platform.post(inc.where, text)
