"""Bus events: what channels put on the bus and what the agent sends back.

Frozen (``@frozen``: to the type checker and in the test suite), slotted, keyword-only
dataclasses so an event can be shared between tasks without anyone changing it underneath
another. Timestamps are always timezone-aware.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import field, fields
from datetime import MAXYEAR, UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, Literal

from gateway.kernel.frozen import frozen

ChatType = Literal["direct", "group"]
InboundKind = Literal["user", "command", "cron", "heartbeat", "subagent"]
OutboundKind = Literal["reply", "progress", "cron", "heartbeat", "notice", "error"]
MediaKind = Literal["image", "audio", "video", "file"]
Trust = Literal["owner", "member", "guest"]
"""Who is speaking, as decided by the channel that took the message in: the *owner* (listed in
``allow_from``, or on the terminal, the local channel or WebChat), a *member* (approved by
pairing or listed in ``members``), or a *guest* (served only because a place is open to all)."""
TRUST_RANK: dict[str, int] = {"guest": 0, "member": 1, "owner": 2}


def lowest_trust(levels: Iterable[Trust]) -> Trust:
    """The least trusted of ``levels`` (several messages answered in one turn)."""
    return min(levels, key=TRUST_RANK.__getitem__, default="guest")


def utcnow() -> datetime:
    return datetime.now(UTC)


def isoformat(ts: datetime) -> str:
    """``ts.isoformat()``, the same text, in a third of the work for a UTC time: the date and
    time to the second are formatted once a second, the microseconds by table (a turn stores
    about nine timestamps; ``datetime.isoformat`` formats through C's printf, ~12,000
    instructions each)."""
    global _second
    if ts.tzinfo is not UTC:
        return ts.isoformat()
    start, end, text = _second
    if not start <= ts < end:
        start = ts.replace(microsecond=0)
        if start.year == MAXYEAR:  # the second after it would overflow
            return ts.isoformat()
        text = start.isoformat()[:-6]  # without "+00:00"
        _second = start, start + timedelta(seconds=1), text
    us = ts.microsecond
    return f"{text}.{_D3[us // 1000]}{_D3[us % 1000]}+00:00" if us else f"{text}+00:00"


_second = (datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC), "")
"""The second ``isoformat`` formatted last: [start, end) and its text (one tuple: replaced
whole, so a thread never sees half of it)."""
_D3 = tuple(f"{i:03d}" for i in range(1000))


def new_id() -> str:
    """A fresh id (a turn, a message, a delivery key): 18 lowercase characters of base32hex
    (RFC 4648's alphabet in the order of its values, so the text sorts as the number), the
    time in milliseconds (45 bits, the first 9) then 45 random bits (the last 9). Ids made
    later sort later, so a turn's rows go at the right-hand end of the indexes on turn ids
    (``turns``, ``context_snapshots``, ``llm_calls``) beside the last turn's, on a page a group
    commit writes once for all its turns: random ids put each on a page of its own
    (bench/RESULTS.md, round thirteen). Unique enough for ids that are keys (a turn's row, an
    outbox row written with ``INSERT OR IGNORE``): two ids of the same millisecond collide with
    a chance of one in 35 trillion, at 500 ids a second about once in ten thousand years, as
    likely as the 80 random bits the ids had before. A turn's id is stored eight times over,
    so it stays short: 18 characters against a UUID's 36."""
    n = (time.time_ns() // 1_000_000) << 45 | int.from_bytes(os.urandom(6), "big") >> 3
    return (_B32[(n >> 80) & 1023] + _B32[(n >> 70) & 1023] + _B32[(n >> 60) & 1023]
            + _B32[(n >> 50) & 1023] + _B32[(n >> 40) & 1023] + _B32[(n >> 30) & 1023]
            + _B32[(n >> 20) & 1023] + _B32[(n >> 10) & 1023] + _B32[n & 1023])


_DIGITS = "0123456789abcdefghijklmnopqrstuv"
_B32 = [a + b for a in _DIGITS for b in _DIGITS]
"""Every pair of lower-case base32 digits, by the 10 bits they stand for."""


@frozen(kw_only=True)
class Media:
    """A file attached to a message: a local path or a remote URL, never both."""

    kind: MediaKind
    path: str | None = None
    url: str | None = None
    mime: str | None = None
    size: int | None = None
    text: str | None = None
    """What the agent's pre-turn step (``agent/media/``) read of it — a transcript, an image's
    description, a document's head — shown to the model after the file's path. An image with
    a text goes to the model as that text, never as an image."""

    def __post_init__(self) -> None:
        if (self.path is None) == (self.url is None):
            raise ValueError("Media needs exactly one of path or url")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("kind", self.kind), ("path", self.path), ("url", self.url),
                                  ("mime", self.mime), ("size", self.size),
                                  ("text", self.text)) if v is not None}


_Plan = tuple[Callable[[Any], tuple[Any, ...]], tuple[str, ...], tuple[str, ...]]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    """(every field's value at once, the field names, the fields whose value may need
    turning into JSON: a datetime, a tuple, the media), once per class."""
    found = fields(cls)
    names = tuple(f.name for f in found)
    special = tuple(f.name for f in found if f.name == "media" or not isinstance(f.type, str)
                    or "datetime" in f.type or "tuple" in f.type)
    getter = attrgetter(*names)
    get = getter if len(names) > 1 else (lambda event: (getter(event),))
    _PLANS[cls] = plan = (get, names, special)
    return plan


def event_to_dict(event: Any) -> dict[str, Any]:
    """A bus event as JSON-ready data, for the durable inbox and outbox."""
    get, names, special = _PLANS.get(type(event)) or _plan(type(event))
    out = dict(zip(names, get(event), strict=True))
    for name in special:
        value = out[name]
        if isinstance(value, datetime):
            out[name] = isoformat(value)
        elif name == "media":
            out[name] = [m.to_dict() for m in value]
        elif isinstance(value, tuple):
            out[name] = list(value)
    return out


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    kwargs = dict(data)
    for key in ("received_at", "created_at"):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = datetime.fromisoformat(kwargs[key])
    kwargs["media"] = tuple(Media(**m) for m in kwargs.get("media") or ())
    if kwargs.get("deliver_to") is not None:
        kwargs["deliver_to"] = tuple(kwargs["deliver_to"])
    return cls(**kwargs)


@frozen(kw_only=True)
class InboundMessage:
    channel: str
    chat_id: str
    sender_id: str
    text: str
    sender_name: str | None = None
    media: tuple[Media, ...] = ()
    message_id: str = field(default_factory=new_id)
    thread_id: str | None = None
    chat_type: ChatType = "direct"
    mentioned: bool = False
    reply_to: str | None = None
    received_at: datetime = field(default_factory=utcnow)
    kind: InboundKind = "user"
    deliver_to: tuple[str, str] | None = None
    """(channel, chat_id) a system message's answer goes to; None means back to its own chat."""
    deliver_thread: str | None = None
    """The thread (Telegram topic, Discord thread) of ``deliver_to`` the answer goes to."""
    session_override: str | None = None
    """A routing override from config; the model never chooses it."""
    context_only: bool = False
    """Kept in the session's history without a turn or a reply (group chatter not addressed to
    the bot, handed over as context right before the next message that is)."""
    senders_inline: bool = False
    """The text already names each sender (several group messages merged into one turn)."""
    trust: Trust = "guest"
    """How far the sender is trusted (``agent/trust.py`` turns it into tools and memory);
    a message nobody vouched for is a guest's."""
    server_id: str | None = None
    """The server (a Discord guild) the chat belongs to; None elsewhere and in direct chats.
    A server can have its own defaults (``agent.chats``)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Platform extras for display and logs; never read to decide what happens."""

    def __post_init__(self) -> None:
        if self.received_at.tzinfo is None:
            raise ValueError("received_at must be timezone-aware")

    @property
    def session_key(self) -> str:
        if self.session_override:
            return self.session_override
        key = f"{self.channel}:{self.chat_id}"
        return f"{key}:{self.thread_id}" if self.thread_id else key

    @property
    def is_command(self) -> bool:
        return self.kind == "command" or (self.kind == "user" and self.text.startswith("/"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InboundMessage:
        data = dict(data)
        old = dict(data.get("metadata") or {})
        for flag in ("context_only", "senders_inline"):  # inbox rows of earlier versions
            if flag in old:
                data.setdefault(flag, bool(old.pop(flag)))
        if "trust" not in data:  # inbox rows from before trust levels: the gateway's own jobs
            data["trust"] = "owner" if data.get("kind") in ("cron", "heartbeat") else "guest"
        data["metadata"] = old
        return _from_dict(cls, data)  # type: ignore[no-any-return]


@frozen(kw_only=True)
class OutboundMessage:
    channel: str
    chat_id: str
    text: str
    media: tuple[Media, ...] = ()
    reply_to: str | None = None
    thread_id: str | None = None
    kind: OutboundKind = "reply"
    turn_id: str | None = None
    idempotency_key: str = field(default_factory=new_id)
    created_at: datetime = field(default_factory=utcnow)
    stream: str | None = None
    """The key of the reply stream (``gateway/kernel/streams.py``) that showed this answer
    while it was written: delivering it edits or replaces what the stream showed."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutboundMessage:
        return _from_dict(cls, data)  # type: ignore[no-any-return]


@frozen(kw_only=True)
class ChatActivity:
    """A turn started (``busy``) or ended for a chat: channels show "typing…" meanwhile."""

    channel: str
    chat_id: str
    thread_id: str | None = None
    busy: bool = True


Stage = Literal["taken", "queued", "done", "failed"]


@frozen(kw_only=True)
class MessageStage:
    """Where a person's message is, for acknowledgement reactions: ``taken`` by a turn (the
    model is about to be asked), ``queued`` behind a busy turn, answered (``done``) or not
    (``failed``)."""

    channel: str
    chat_id: str
    message_id: str
    stage: Stage
    thread_id: str | None = None
