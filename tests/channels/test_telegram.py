"""The Telegram adapter against the fake Bot API: the real python-telegram-bot talking HTTP to
``tests/fakes/telegram_server.py`` (its translation rules are in ``test_telegram_convert``)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.inbound import PUBLISH_ATTEMPTS
from channels.telegram import TelegramChannel, TelegramChannelError
from gateway.kernel.backoff import BackoffPolicy
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import TelegramChannelConfig
from gateway.kernel.events import ChatActivity, InboundMessage, Media, OutboundMessage
from gateway.kernel.store import Store
from gateway.kernel.values import COMMAND_DESCRIPTIONS
from tests.fakes.telegram_server import TOKEN, FakeTelegram


class FlakyBus(MessageBus):
    """Fails to store the first ``failures`` messages, like a locked or full database."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures

    async def publish_inbound(self, msg: InboundMessage) -> bool:
        if self.failures:
            self.failures -= 1
            raise OSError("database is locked")
        return await super().publish_inbound(msg)


class Clock:
    """Monotonic seconds that move only when a test says: no watchdog fires because the
    machine is slow."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


MakeChannel = Callable[..., Awaitable[TelegramChannel]]


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def make_channel(tg: FakeTelegram, store: Store,
                       tmp_path: Path) -> AsyncIterator[MakeChannel]:
    made: list[TelegramChannel] = []

    async def make(bus: MessageBus | None = None, clock: Callable[[], float] | None = None,
                   start: bool = True, **settings: Any) -> TelegramChannel:
        config = TelegramChannelConfig(**{
            "enabled": True, "token": tg.token, "base_url": tg.base_url,
            "base_file_url": tg.base_file_url, "poll_timeout": "0.2s", "watchdog": "2s",
            "dm_policy": "open", "typing_interval": "0.05s", **settings})
        channel = TelegramChannel(config, bus=bus or MessageBus(), store=store,
                                  workspace=tmp_path, clock=clock or Clock())
        made.append(channel)
        if start:
            await channel.start()
        return channel

    yield make
    for channel in made:
        await channel.stop()


async def next_inbound(bus: MessageBus) -> InboundMessage:
    return await asyncio.wait_for(bus.consume_inbound(), 10)


async def test_updates_from_while_we_were_down_are_read_and_confirmed_on_stop(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    tg.dm(tg.user(1001, "Ada"), "sent while the gateway was down")
    bus = MessageBus()
    channel = await make_channel(bus)
    assert (await next_inbound(bus)).text == "sent while the gateway was down"
    await tg.wait_for(lambda: tg.commands is not None)  # set alongside polling, not before
    assert [c["command"] for c in tg.commands or []] == list(COMMAND_DESCRIPTIONS)
    await channel.stop()
    assert tg.updates == []  # the stop confirmed the offset: a restart will not re-read it


async def test_offset_moves_only_after_the_message_is_stored(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    bus = FlakyBus(failures=1)
    await make_channel(bus)
    tg.dm(tg.user(1001, "Ada"), "keep me")
    received = await next_inbound(bus)
    assert received.text == "keep me" and bus.failures == 0
    assert bus.inbound_size == 0  # stored once, after a failed attempt
    offsets = [int(p["offset"]) for m, p in tg.calls if m == "getUpdates" and p.get("offset")]
    assert offsets == sorted(offsets)


async def test_a_message_that_cannot_be_stored_is_not_confirmed_but_read_again(
        tg: FakeTelegram, make_channel: MakeChannel, monkeypatch: pytest.MonkeyPatch) -> None:
    """More failures than one round of tries (a deleted database): the update is never
    confirmed, so Telegram hands it out again, and it is taken once storing works again."""
    bus = FlakyBus(failures=PUBLISH_ATTEMPTS + 2)
    channel = await make_channel(bus, start=False)
    monkeypatch.setattr(channel._inbound, "_retry", BackoffPolicy(base=0.001, cap=0.001))
    await channel.start()
    tg.dm(tg.user(1001, "Ada"), "do not lose me")
    update_id = tg.updates[-1]["update_id"]
    received = await next_inbound(bus)
    assert received.text == "do not lose me" and bus.failures == 0
    offered = [m for m, p in tg.calls
               if m == "getUpdates" and int(p.get("offset") or 0) <= update_id]
    assert len(offered) >= 2  # handed out again after the first round of tries failed


async def test_watchdog_rebuilds_a_stalled_poll_and_health_says_so(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    clock = Clock()
    bus = MessageBus()
    channel = await make_channel(bus, clock=clock)
    await channel.wait_until(lambda c: c.last_poll_ok is not None)
    assert channel.status().running and not channel.status().detail["degraded"]
    await tg.set_stall(True)
    await tg.wait_for(lambda: tg.stalled_polls >= 1)
    clock.now += 3  # three seconds without a completed getUpdates (watchdog: 2 s)
    status = channel.status()
    assert not status.running and status.detail["degraded"] is True
    await channel.wait_until(lambda c: c.watchdog_restarts >= 1)
    await tg.set_stall(False)
    tg.dm(tg.user(1001, "Ada"), "still there?")
    assert (await next_inbound(bus)).text == "still there?"
    assert channel.status().running


async def test_a_sent_message_is_not_a_sign_of_life(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    clock = Clock()
    channel = await make_channel(clock=clock)
    await channel.wait_until(lambda c: c.last_poll_ok is not None)
    await tg.set_stall(True)
    await tg.wait_for(lambda: tg.stalled_polls >= 1)
    tg.private(tg.user(1001, "Ada"))
    assert (await channel.send(OutboundMessage(channel="telegram", chat_id="1001",
                                               text="hi"))).ok
    clock.now += 3
    assert channel.status().detail["degraded"] is True


async def test_a_failed_part_is_resumed_not_repeated(
        tg: FakeTelegram, make_channel: MakeChannel, store: Store, tmp_path: Path) -> None:
    channel = await make_channel()
    tg.private(tg.user(1001, "Ada"))
    text = "\n\n".join(f"Paragraph {i}: " + "words " * 150 for i in range(12))
    out = OutboundMessage(channel="telegram", chat_id="1001", text=text)
    tg.fail_next("sendMessage", 500)
    tg.fail_next("sendMessage", 429, retry_after=3)
    first = await channel.send(out)
    assert not first.ok and not first.permanent and first.retry_after is None
    second = await channel.send(out)
    assert second.retry_after == 3
    tg.fail_next("sendMessage", drop=True)
    assert not (await channel.send(out)).ok  # a dropped connection: retryable
    done = await channel.send(out)
    assert done.ok and len(done.message_ids) == len(tg.sent) >= 3
    # A fresh channel on the same database (a restart) knows it was all delivered.
    again = await make_channel()
    assert (await again.send(out)).message_ids == done.message_ids
    assert len(tg.sent) == len(done.message_ids)
    bodies = [s.text for s in tg.sent]
    assert len(set(bodies)) == len(bodies)


async def test_partial_delivery_resumes_at_the_next_part(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    channel = await make_channel()
    tg.private(tg.user(1001, "Ada"))
    out = OutboundMessage(channel="telegram", chat_id="1001",
                          text="\n\n".join("x" * 3000 for _ in range(3)))
    original = tg._m_sendMessage
    calls = 0

    async def fail_second(params: dict[str, Any], files: dict[str, Any]) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            from tests.fakes.telegram_server import ApiError
            raise ApiError(429, "Too Many Requests: retry after 1", {"retry_after": 1})
        return await original(params, files)

    tg._m_sendMessage = fail_second  # type: ignore[method-assign]
    failed = await channel.send(out)
    assert failed.retry_after == 1 and len(tg.sent) == 1
    done = await channel.send(out)
    assert done.ok and len(tg.sent) == 3 and done.message_ids[0] == str(tg.sent[0].message_id)


async def test_refused_html_is_resent_as_plain_text(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    channel = await make_channel()
    tg.private(tg.user(1001, "Ada"))
    tg.fail_next("sendMessage", 400, description="Bad Request: can't parse entities: "
                 "Unsupported start tag \"x\" at byte offset 0")
    delivery = await channel.send(OutboundMessage(channel="telegram", chat_id="1001",
                                                  text="**Bold** and [a link](https://e.com)"))
    assert delivery.ok
    [sent] = tg.sent
    assert sent.parse_mode is None and sent.text == "Bold and a link (https://e.com)"


async def test_blocked_by_the_user_is_permanent(tg: FakeTelegram,
                                                make_channel: MakeChannel) -> None:
    channel = await make_channel()
    tg.private(tg.user(1001, "Ada"))
    tg.blocked.add(1001)
    delivery = await channel.send(OutboundMessage(channel="telegram", chat_id="1001", text="hi"))
    assert delivery.permanent and "blocked" in (delivery.error or "")


async def test_media_out_photo_document_and_missing(tg: FakeTelegram, make_channel: MakeChannel,
                                                    tmp_path: Path) -> None:
    channel = await make_channel()
    tg.private(tg.user(1001, "Ada"))
    picture, report = tmp_path / "chart.png", tmp_path / "report.pdf"
    picture.write_bytes(b"\x89PNG fake")
    report.write_bytes(b"%PDF fake")
    delivery = await channel.send(OutboundMessage(
        channel="telegram", chat_id="1001", text="Here you go", media=(
            Media(kind="image", path=str(picture), mime="image/png"),
            Media(kind="file", path=str(report), mime="application/pdf"),
            Media(kind="file", path=str(tmp_path / "gone.txt")))))
    assert delivery.ok and len(delivery.message_ids) == 4
    text, photo, document, missing = tg.sent
    assert (photo.method, photo.data, photo.filename) == ("sendPhoto", b"\x89PNG fake",
                                                          "chart.png")
    assert (document.method, document.data) == ("sendDocument", b"%PDF fake")
    assert missing.text == "(Could not attach gone.txt: not found.)"


async def test_typing_while_busy_and_stops_when_done(tg: FakeTelegram,
                                                     make_channel: MakeChannel) -> None:
    channel = await make_channel()
    tg.group(-100123, "Friends", forum=True)
    busy = ChatActivity(channel="telegram", chat_id="-100123", thread_id="55")
    channel.activity(busy)
    await tg.wait_for(lambda: len(tg.actions) >= 3)
    assert set(tg.actions) == {(-100123, "typing", 55)}
    channel.activity(ChatActivity(channel="telegram", chat_id="-100123", thread_id="55",
                                  busy=False))
    assert channel._typing.running == {}


async def test_photo_download_and_the_size_cap(tg: FakeTelegram, make_channel: MakeChannel,
                                               tmp_path: Path) -> None:
    bus = MessageBus()
    await make_channel(bus, max_media_bytes=1000)
    ada = tg.user(1001, "Ada")
    chat = tg.private(ada)
    tg.photo(chat, ada, b"jpeg bytes", "what is this?")
    got = await next_inbound(bus)
    assert got.text == "what is this?"
    [media] = got.media
    assert media.kind == "image" and Path(media.path or "").read_bytes() == b"jpeg bytes"
    assert Path(media.path or "").parent == tmp_path / "inbox" / "telegram" / "1001"
    tg.document(chat, ada, b"x" * 2000, "big.pdf", "application/pdf", "summarize it")
    got = await next_inbound(bus)
    assert got.media == ()
    assert got.text == ('summarize it\n[The user attached a document "big.pdf" (2 KB) that was '
                        'not downloaded: it is over the 1000 bytes limit.]')
    [refusal] = await tg.wait_sent(1001)
    assert refusal.text == ('Sorry, that document "big.pdf" (2 KB) is too big for me: I can take '
                            'files up to 1000 bytes.')


async def test_voice_is_saved_and_referenced_by_path(tg: FakeTelegram,
                                                     make_channel: MakeChannel) -> None:
    bus = MessageBus()
    await make_channel(bus)
    ada = tg.user(1001, "Ada")
    tg.voice(tg.private(ada), ada, b"OggS voice")
    got = await next_inbound(bus)
    [media] = got.media
    assert (media.kind, media.mime, media.size) == ("audio", "audio/ogg", 10)
    assert media.path is not None and media.path.endswith(".oga")
    assert Path(media.path).read_bytes() == b"OggS voice"


async def test_unknown_user_gets_a_pairing_code_not_a_turn(
        tg: FakeTelegram, make_channel: MakeChannel) -> None:
    bus = MessageBus()
    channel = await make_channel(bus, dm_policy="pairing")
    stranger = tg.user(1002, "Bob")
    tg.dm(stranger, "hello?")
    [reply] = await tg.wait_sent(1002)
    [code] = await channel.pairing.pending("telegram")
    assert code.user_id == "1002" and code.code in reply.text
    assert f"parley pairing approve telegram {code.code}" in reply.text
    assert bus.inbound_size == 0
    await channel.pairing.approve("telegram", code.code)
    tg.dm(stranger, "and now?")
    assert (await next_inbound(bus)).text == "and now?"


async def test_bad_token_fails_start_without_showing_it(
        tg: FakeTelegram, store: Store, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = TelegramChannelConfig(enabled=True, token="999:wrong-secret-token",
                                   base_url=tg.base_url, base_file_url=tg.base_file_url)
    channel = TelegramChannel(config, bus=MessageBus(), store=store, workspace=tmp_path)
    with pytest.raises(TelegramChannelError) as info:
        await channel.start()
    await channel.stop()
    assert "channels.telegram.token was refused" in str(info.value)
    assert "wrong-secret-token" not in str(info.value)
    assert "wrong-secret-token" not in caplog.text


async def test_token_never_reaches_the_log(tg: FakeTelegram, make_channel: MakeChannel,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # Another library imported earlier in the process (litellm) may have quietened these.
    for name in ("httpx", "httpcore", "telegram"):
        caplog.set_level(logging.DEBUG, logger=name)
    bus = MessageBus()
    channel = await make_channel(bus)
    ada = tg.user(1001, "Ada")
    tg.photo(tg.private(ada), ada, b"img", "hi")
    await next_inbound(bus)
    tg.fail_next("sendMessage", drop=True)
    await channel.send(OutboundMessage(channel="telegram", chat_id="1001", text="hi"))
    await channel.stop()
    assert "/bot[token]/getUpdates" in caplog.text  # httpx logged its URLs...
    assert TOKEN not in caplog.text  # ...without the token


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_webhook_mode_needs_the_secret(tg: FakeTelegram,
                                             make_channel: MakeChannel) -> None:
    port = free_port()
    bus = MessageBus()
    channel = await make_channel(bus, mode="webhook", webhook_url=f"http://127.0.0.1:{port}/tg",
                                 webhook_secret="s3cret_value", webhook_port=port)
    await channel.wait_until(lambda c: not c.status().detail["degraded"])
    assert tg.webhook == {"url": f"http://127.0.0.1:{port}/tg", "secret_token": "s3cret_value"}
    tg.dm(tg.user(1001, "Ada"), "via webhook")
    got = await next_inbound(bus)
    assert got.text == "via webhook" and not got.context_only
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}/tg", json={"update_id": 99},
                                headers={"X-Telegram-Bot-Api-Secret-Token": "wrong"}) as resp:
            assert resp.status == 401
    assert not any(m == "getUpdates" for m, _ in tg.calls)
