"""The shared inbound pipeline, against a fake platform: group context, attachments and their
cap, pairing replies in the platform's words, other bots, and storing with retries. Each
platform's own tests drive the same code through its real library."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from channels.access import AccessRules
from channels.inbound import Inbound
from channels.incoming import (
    Attachment,
    DownloadFailed,
    Fetched,
    Incoming,
    Sender,
    Wording,
)
from gateway.kernel.backoff import BackoffPolicy
from gateway.kernel.bus import MessageBus
from gateway.kernel.events import InboundMessage
from gateway.kernel.pairing import PairingStore

ADA = Sender(id="1", name="Ada Lovelace", first_name="Ada")
BOB = Sender(id="2", name="Bob")
ROBOT = Sender(id="3", name="Robot", is_bot=True)
LIMIT = 100


def refusal(refused: Sequence[Attachment], limit: int) -> str:
    return f"too big (over {limit}): " + ", ".join(a.label for a in refused)


WORDING = Wording(title="Chat", place="room", command="`{}`", context_mark="[file {label}]",
                  failed_note="[{label} was lost]", too_big_note="[{label}, {size}, over {limit}]",
                  too_big_reply=refusal)


class FakePlatform:
    """Files by ``source``: bytes, None (over the limit once fetched) or an exception."""

    def __init__(self, **files: bytes | None | Exception) -> None:
        self.files = files
        self.notices: list[tuple[str, str, bool]] = []

    async def fetch(self, inc: Incoming, index: int, att: Attachment,
                    limit: int) -> Fetched | None:
        found = self.files[att.source]
        if isinstance(found, Exception):
            raise found
        return None if found is None else Fetched(found, f"{inc.id}-{index}")

    async def notice(self, inc: Incoming, text: str, *, reply: bool) -> None:
        self.notices.append((inc.where, text, reply))


class FlakyBus(MessageBus):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def publish_inbound(self, msg: InboundMessage) -> bool:
        if self.failures:
            self.failures -= 1
            raise OSError("database is locked")
        return await super().publish_inbound(msg)


def said(sender: Sender, text: str = "hi", *, direct: bool = False, addressed: bool = True,
         thread: str | None = None, files: tuple[Attachment, ...] = (),
         mid: str = "10") -> Incoming:
    chat = sender.id if direct else "room"
    return Incoming(platform="chat", id=mid, where=thread or chat, chat_id=chat,
                    thread_id=thread, direct=direct, sender=sender, addressed=addressed,
                    text=text, attachments=files, received_at=datetime(2026, 3, 1, tzinfo=UTC))


def file(source: str, size: int | None = 10) -> Attachment:
    return Attachment(source=source, kind="file", mime="text/plain", size=size,
                      label=f"{source}.txt", name=f"{source}.txt")


def pipeline(platform: FakePlatform, pairing: PairingStore, tmp_path: Path, *,
             bus: MessageBus | None = None, **settings: Any) -> Inbound:
    allow_bots = settings.pop("allow_bots", False)
    rules = AccessRules.of(**{"dm_policy": "pairing", "group_policy": "mention",
                              "group_history": 20, "allow_from": [ADA.id], **settings})
    return Inbound("chat", platform, WORDING, bus=bus or MessageBus(), pairing=pairing,
                   rules=rules, workspace=tmp_path, max_media_bytes=LIMIT,
                   allow_bots=allow_bots, retry=BackoffPolicy(base=0.001, jitter=0.0))


async def test_group_chatter_goes_along_as_context(pairing: PairingStore,
                                                   tmp_path: Path) -> None:
    inbound = pipeline(FakePlatform(), pairing, tmp_path)
    assert await inbound.prepare(said(BOB, "take the train", addressed=False,
                                      files=(file("map"),), mid="1")) == []
    assert await inbound.prepare(said(BOB, "elsewhere", addressed=False, thread="t",
                                      mid="2")) == []
    assert await inbound.prepare(said(BOB, "I am not listed", mid="3")) == []  # context too
    ready = await inbound.prepare(said(ADA, "what do you think?", mid="4"))
    assert [(m.text, m.context_only) for m in ready] == [
        ("take the train\n[file map.txt]", True), ("I am not listed", True),
        ("what do you think?", False)]
    assert ready[-1].mentioned and ready[-1].chat_type == "group"
    assert [m.text for m in await inbound.prepare(said(ADA, "again"))] == ["again"]
    in_thread = await inbound.prepare(said(ADA, "and here?", thread="t"))
    assert [m.text for m in in_thread] == ["elsewhere", "and here?"]


async def test_files_saved_refused_or_noted(pairing: PairingStore, tmp_path: Path) -> None:
    platform = FakePlatform(ok=b"hello", big=b"x" * 500, grown=None,
                            lost=DownloadFailed("HTTP 502"))
    inbound = pipeline(platform, pairing, tmp_path)
    files = (file("ok"), file("big", size=500), file("grown", size=None), file("lost"))
    [msg] = await inbound.prepare(said(ADA, "look", direct=True, files=files))
    [media] = msg.media
    assert Path(media.path or "").read_bytes() == b"hello" and media.size == 5
    assert Path(media.path or "") == tmp_path / "inbox" / "chat" / "1" / "10-0"
    assert msg.text == ("look\n[big.txt, 500 bytes, over 100 bytes]\n"
                        "[grown.txt, unknown size, over 100 bytes]\n[lost.txt was lost]")
    assert platform.notices == [("1", "too big (over 100): big.txt, grown.txt", True)]


async def test_a_refusal_alone_is_no_message_but_a_lost_file_is(pairing: PairingStore,
                                                                tmp_path: Path) -> None:
    platform = FakePlatform(lost=DownloadFailed("timeout"))
    inbound = pipeline(platform, pairing, tmp_path)
    assert await inbound.prepare(said(ADA, "", direct=True, files=(file("big", 500),))) == []
    assert len(platform.notices) == 1  # the user was told
    [msg] = await inbound.prepare(said(ADA, "", direct=True, files=(file("lost"),)))
    assert msg.text == "[lost.txt was lost]"  # the agent can say so


async def test_a_stranger_gets_a_pairing_code_in_the_platform_words(
        pairing: PairingStore, tmp_path: Path) -> None:
    platform = FakePlatform()
    inbound = pipeline(platform, pairing, tmp_path)
    stranger = Sender(id="9", name="Grace Hopper", first_name="Grace")
    assert await inbound.prepare(said(stranger, direct=True)) == []
    [(where, text, reply)] = platform.notices
    [code] = await pairing.pending("chat")
    assert (where, reply, code.user_id, code.user_name) == ("9", False, "9", "Grace Hopper")
    assert text.startswith("Hi Grace! I only talk to people my owner approved.")
    assert f"`parley pairing approve chat {code.code}`" in text
    assert text.endswith("Your Chat user id is 9.")


async def test_other_bots_are_dropped_unless_allowed(pairing: PairingStore,
                                                     tmp_path: Path) -> None:
    robot = said(ROBOT, "hello bot", direct=True)
    assert await pipeline(FakePlatform(), pairing, tmp_path,
                          dm_policy="open").prepare(robot) == []
    allowed = pipeline(FakePlatform(), pairing, tmp_path, dm_policy="open", allow_bots=True)
    assert [m.text for m in await allowed.prepare(robot)] == ["hello bot"]


async def test_storing_is_retried_and_never_acknowledged_unless_it_worked(
        pairing: PairingStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bus = FlakyBus(failures=2)
    inbound = pipeline(FakePlatform(), pairing, tmp_path, bus=bus)

    async def convert(text: str, mid: str) -> Incoming:
        return said(ADA, text, direct=True, mid=mid)

    assert await inbound.take(convert("kept", "1"), "message 1")
    assert (await bus.consume_inbound()).text == "kept" and inbound.last_inbound is not None
    bus.failures = 5
    assert not await inbound.take(convert("kept too", "2"), "message 2")  # not acknowledged
    assert bus.inbound_size == 0
    assert ("chat: message 2 not stored after 5 attempts (database is locked); not "
            "acknowledged, so Chat offers it again") in caplog.text
    assert await inbound.take(convert("kept too", "2"), "message 2")  # offered again: stored
    assert (await bus.consume_inbound()).text == "kept too"
    bus.close()
    assert not await inbound.take(convert("late", "3"), "message 3")  # stopping


async def test_a_message_it_cannot_handle_is_skipped(pairing: PairingStore, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> Incoming:
        raise ValueError("unreadable")

    inbound = pipeline(FakePlatform(), pairing, tmp_path)
    with caplog.at_level(logging.ERROR):
        assert await inbound.take(broken(), "update 7")
    assert "chat: could not handle update 7" in caplog.text
