"""The channel contract: what every channel must do, checked from outside through a fake of
its platform, the same way for the built-in channels and for a plugin's.

    fake = MyPlatformFake()                       # the platform, on loopback or in memory
    async with ChannelContract(MyChannel, fake, tmp_path) as contract:
        await contract.run("inbound")             # or: for name in CHECKS

Each check starts the channel on a fresh database and bus, exactly as the gateway builds it
(``from_deps`` with the config section the fake gives), and drives it only through the fake and
``Channel.send``:

- ``inbound``: the owner's direct message reaches the bus, stored, with the channel's name, the
  session key ``<channel>:<chat>`` and the trust ``owner``;
- ``reply``: a reply sent to that chat is delivered (``Delivery.ok``) and the platform shows it;
- ``chunking``: a reply over the channel's ``hints.max_length`` arrives in parts, none over the
  limit, the words all there in order (without a limit: in one message, whole);
- ``failed_send``: when the platform refuses, ``send`` answers a ``Delivery`` that is not ok
  (never an exception);
- ``stranger``: a stranger's direct message never reaches the bus (with pairing, the stranger
  gets a pairing code instead).

A check a channel cannot take part in is named in the fake's ``not_applicable`` with the
reason; it then passes by saying so, never silently.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from channels.base import Channel, ChannelDeps
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import parse_config
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.store import Store
from gateway.kernel.values import Delivery

CHECKS = ("inbound", "reply", "chunking", "failed_send", "stranger")
OWNER = "1001"
STRANGER = "2002"
CAP = 20.0
"""Seconds any one wait may take before the check fails as hung (a cap, never an outcome)."""


class ContractFailure(AssertionError):
    """The channel broke the contract; the message says which check and how."""


class PlatformFake(Protocol):
    """A fake of the channel's platform, driven by the kit. Every wait is on an event."""

    pairing: bool
    """A stranger's direct message gets a pairing code (``dm_policy: pairing``)."""
    not_applicable: Mapping[str, str]
    """Checks (of ``CHECKS``) this channel cannot take part in, each with the reason."""

    def section(self, *, owner: str) -> Any:
        """The channel's config section (its ``config_model``), enabled and pointed at this
        fake, serving ``owner`` as the owner (``allow_from``) and strangers by pairing."""
        ...

    def attach(self, channel: Channel) -> None:
        """Called once the channel started (a fake that needs its address, say)."""
        ...

    def chat_of(self, user: str) -> str:
        """The chat id of ``user``'s direct chat with the bot, as the channel names it."""
        ...

    async def user_says(self, user: str, text: str) -> None:
        """``user`` sends ``text`` to the bot in their direct chat; returns once the platform
        handed it to the bot (or refused it, for a stranger the platform itself refuses)."""
        ...

    async def bot_messages(self, chat_id: str, count: int) -> list[str]:
        """Every text the bot posted in ``chat_id`` so far, once there are at least ``count``
        (waiting for them, on an event)."""
        ...

    async def fail_sends(self) -> None:
        """From now on the platform refuses the bot's messages (an error answer)."""
        ...


class ChannelContract:
    def __init__(self, plugin: Any, fake: PlatformFake, workdir: Path, *,
                 owner: str = OWNER, stranger: str = STRANGER) -> None:
        """``plugin``: the channel class (as its entry point names it)."""
        self.plugin = plugin
        self.fake = fake
        self.workdir = workdir
        self.owner = owner
        self.stranger = stranger
        self.bus = MessageBus()
        self.store: Store | None = None
        self.channel: Channel | None = None

    async def __aenter__(self) -> ChannelContract:
        self.workdir.mkdir(parents=True, exist_ok=True)
        name = self.plugin.name
        section = self.fake.section(owner=self.owner)
        config = parse_config({"workspace": str(self.workdir / "workspace"),
                               "data_dir": str(self.workdir / "data"),
                               "channels": {"local": {"enabled": name == "local"},
                                            name: section}}, env={})
        self.store = await Store.open(config.db_path)
        self.bus.attach_store(self.store, config.channels.delivery.ttl)
        deps = ChannelDeps(config=config, bus=self.bus, store=self.store,
                           data_path=config.data_path, health=dict)
        channel = self.plugin.from_deps(deps)
        if not isinstance(channel, Channel):
            raise ContractFailure(f"{name}: from_deps made {channel!r}, not a Channel")
        self.channel = channel
        async with asyncio.timeout(CAP):
            await channel.start()
        self.fake.attach(channel)
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        if self.channel is not None:
            await self.channel.stop()
        if self.store is not None:
            await self.store.close()

    # --- the checks -----------------------------------------------------------------------------

    async def run(self, check: str) -> str:
        """Run one check; returns what it found ("ok" or "not applicable: <why>")."""
        if check not in CHECKS:
            raise ValueError(f"unknown check {check!r} (checks: {', '.join(CHECKS)})")
        why = self.fake.not_applicable.get(check)
        if why is not None:
            if not why.strip():
                raise ContractFailure(f"{check}: not applicable, but no reason given")
            return f"not applicable: {why}"
        async with asyncio.timeout(CAP):
            await getattr(self, f"_check_{check}")()
        return "ok"

    @property
    def name(self) -> str:
        return str(self.plugin.name)

    def _fail(self, check: str, what: str) -> ContractFailure:
        return ContractFailure(f"{self.name}: {check}: {what}")

    async def _check_inbound(self) -> None:
        text = "hello from the contract kit"
        await self.fake.user_says(self.owner, text)
        msg = await self.bus.consume_inbound()
        chat = self.fake.chat_of(self.owner)
        expected = {"channel": self.name, "session_key": f"{self.name}:{chat}",
                    "trust": "owner", "chat_type": "direct", "sender_id": self.owner}
        found = {key: getattr(msg, key) for key in expected}
        if found != expected:
            raise self._fail("inbound", f"expected {expected}, the bus got {found}")
        if text not in msg.text:
            raise self._fail("inbound", f"the text {text!r} is not in {msg.text!r}")

    async def _send(self, check: str, text: str) -> Delivery:
        assert self.channel is not None
        chat = self.fake.chat_of(self.owner)
        delivery = await self.channel.send(OutboundMessage(channel=self.name, chat_id=chat,
                                                           text=text))
        if not isinstance(delivery, Delivery):
            raise self._fail(check, f"send answered {delivery!r}, not a Delivery")
        return delivery

    async def _check_reply(self) -> None:
        text = "a reply from the contract kit"
        delivery = await self._send("reply", text)
        if not delivery.ok:
            raise self._fail("reply", f"not delivered: {delivery.error}")
        shown = await self.fake.bot_messages(self.fake.chat_of(self.owner), 1)
        if not any(text in s for s in shown):
            raise self._fail("reply", f"the platform shows {shown!r}, not {text!r}")

    async def _check_chunking(self) -> None:
        assert self.channel is not None
        limit = self.channel.hints.max_length
        words = [f"word{i}" for i in range(max(200, math.ceil((limit or 2000) * 2.5 / 8)))]
        text = " ".join(words)
        delivery = await self._send("chunking", text)
        if not delivery.ok:
            raise self._fail("chunking", f"not delivered: {delivery.error}")
        # An ok Delivery means the platform has every part: read what it shows now.
        shown = await self.fake.bot_messages(self.fake.chat_of(self.owner), 1)
        seen = [w for s in shown for w in re.findall(r"word\d+", s)]
        if seen != words:
            raise self._fail("chunking", f"the words arrived changed or out of order "
                             f"({len(seen)} of {len(words)})")
        if limit is None and len(shown) != 1:
            raise self._fail("chunking", f"no length limit, yet {len(shown)} messages")
        too_long = [len(s) for s in shown if limit is not None and len(s) > limit]
        if too_long:
            raise self._fail("chunking", f"parts of {too_long} characters, over {limit}")

    async def _check_failed_send(self) -> None:
        await self.fake.fail_sends()
        try:
            delivery = await self._send("failed_send", "this cannot be delivered")
        except Exception as exc:
            raise self._fail("failed_send", f"send raised {type(exc).__name__}: {exc} "
                             "instead of answering a Delivery") from exc
        if delivery.ok:
            raise self._fail("failed_send", "the platform refused, yet the Delivery is ok")

    async def _check_stranger(self) -> None:
        """With pairing: whichever comes first, the pairing code or the message on the bus,
        decides. Without: ``user_says`` returned once the channel handled (or refused) it."""
        await self.fake.user_says(self.stranger, "let me in")
        if self.fake.pairing:
            bus = asyncio.ensure_future(self.bus.consume_inbound())
            code = asyncio.ensure_future(
                self.fake.bot_messages(self.fake.chat_of(self.stranger), 1))
            done, pending = await asyncio.wait({bus, code}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if bus in done:
                raise self._fail("stranger", f"a stranger's message reached the bus: "
                                 f"{bus.result()}")
            shown = code.result()
            if not any("pairing code" in s.lower() for s in shown):
                raise self._fail("stranger", f"no pairing code for the stranger: {shown!r}")
        leaked: list[InboundMessage] = self.bus.drain_inbound()
        if leaked:
            raise self._fail("stranger", f"a stranger's message reached the bus: {leaked[0]}")
