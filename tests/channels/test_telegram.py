"""The Telegram channel: pure translation rules, then the adapter against the fake Bot API
(the real python-telegram-bot talking HTTP to ``tests/fakes/telegram_server.py``)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from telegram import Message, User
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TimedOut

from channels.telegram import TelegramChannel, TelegramChannelError
from channels.telegram_access import Access
from channels.telegram_convert import (
    SecretFilter,
    addressing,
    map_errors,
    media_ref,
    message_text,
    plan_parts,
    reply_context,
    to_inbound,
)
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import ConfigError, TelegramChannelConfig, parse_config
from gateway.kernel.events import ChatActivity, InboundMessage, Media, OutboundMessage
from gateway.kernel.pairing import PairingStore
from gateway.kernel.store import Store
from gateway.kernel.values import COMMAND_DESCRIPTIONS
from tests.fakes.telegram_server import TOKEN, FakeTelegram, parse_html

BOT_ID = 777000111
BOT: dict[str, Any] = {"id": BOT_ID, "is_bot": True, "first_name": "Parley",
                       "username": "parley_bot"}
ADA = {"id": 1001, "is_bot": False, "first_name": "Ada", "last_name": "Lovelace",
       "username": "ada"}
BOB = {"id": 1002, "is_bot": False, "first_name": "Bob"}
GROUP = {"id": -100123, "type": "supergroup", "title": "Friends"}
COMMANDS = ["new", "status", "help", "start"]


def msg(text: str | None = None, *, chat: dict[str, Any] | None = None,
        user: dict[str, Any] = ADA, **extra: Any) -> Message:
    data: dict[str, Any] = {"message_id": 7, "date": 1_800_000_000, "from": user,
                            "chat": chat or {"id": user["id"], "type": "private"}, **extra}
    if text is not None:
        data["text"] = text
        data["entities"] = FakeTelegram.entities(text)
    return Message.de_json(data, None)


# --- translation ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "extra", "expected"), [
    ("@parley_bot hi", {}, (True, False, False)),
    ("hi @Parley_Bot", {}, (True, False, False)),
    ("hi @other_bot", {}, (False, False, False)),
    ("/status@parley_bot", {}, (False, False, True)),
    ("/status", {}, (False, False, True)),
    ("/status@other_bot", {}, (False, False, False)),
    ("/weather", {}, (False, False, False)),
    ("thanks", {"reply_to_message": {"message_id": 3, "date": 1, "chat": GROUP, "from": BOT,
                                     "text": "answer"}}, (False, True, False)),
    ("thanks", {"reply_to_message": {"message_id": 3, "date": 1, "chat": GROUP, "from": BOB,
                                     "text": "x"}}, (False, False, False)),
])
def test_who_the_group_message_addresses(text: str, extra: dict[str, Any],
                                         expected: tuple[bool, bool, bool]) -> None:
    found = addressing(msg(text, chat=GROUP, **extra), bot_id=BOT_ID,
                       bot_username="parley_bot", commands=COMMANDS)
    assert (found.mention, found.reply, found.command) == expected


def test_text_mention_of_the_bot_counts() -> None:
    message = msg("Parley, hi", chat=GROUP)
    message = Message.de_json({**message.to_dict(), "entities": [
        {"type": "text_mention", "offset": 0, "length": 6, "user": BOT}]}, None)
    assert addressing(message, bot_id=BOT_ID, bot_username="parley_bot",
                      commands=COMMANDS).mention


def test_mention_is_stripped_even_after_emoji() -> None:
    """Entity offsets are UTF-16 units: an emoji before the mention counts twice."""
    text = message_text(msg("😀😀 @parley_bot what's the plan?", chat=GROUP),
                        bot_id=BOT_ID, bot_username="parley_bot")
    assert text == "😀😀 what's the plan?"
    assert message_text(msg("@parley_bot, status?", chat=GROUP), bot_id=BOT_ID,
                        bot_username="parley_bot") == "status?"


def test_inbound_from_a_direct_message() -> None:
    inbound = to_inbound(msg("/status"), text="/status")
    assert (inbound.channel, inbound.chat_id, inbound.sender_id) == ("telegram", "1001", "1001")
    assert inbound.sender_name == "Ada Lovelace" and inbound.chat_type == "direct"
    assert inbound.message_id == "7" and inbound.kind == "command"
    assert inbound.received_at.tzinfo is not None and inbound.session_key == "telegram:1001"


def test_inbound_from_a_forum_topic_and_a_reply_thread() -> None:
    topic = to_inbound(msg("hi", chat=GROUP, user=BOB, message_thread_id=55,
                           is_topic_message=True), text="hi")
    assert topic.session_key == "telegram:-100123:55" and topic.chat_type == "group"
    assert topic.sender_name == "Bob"
    plain = to_inbound(msg("hi", chat=GROUP, message_thread_id=3), text="hi")
    assert plain.thread_id is None  # a reply thread in a normal group is not a topic


def test_replying_to_someone_gives_the_agent_the_quote() -> None:
    replied = {"message_id": 3, "date": 1, "chat": GROUP, "from": BOB,
               "text": "The meeting moved to Friday at 10"}
    text = message_text(msg("@parley_bot what does this mean?", chat=GROUP,
                            reply_to_message=replied), bot_id=BOT_ID,
                        bot_username="parley_bot")
    assert text == '[Replying to Bob: "The meeting moved to Friday at 10"]\nwhat does this mean?'
    assert message_text(msg("/new", chat=GROUP, reply_to_message=replied), bot_id=BOT_ID,
                        bot_username="parley_bot") == "/new"
    topic_root = {"message_id": 55, "date": 1, "chat": GROUP, "from": BOB,
                  "forum_topic_created": {"name": "Trips", "icon_color": 1}}
    assert reply_context(msg("hi", chat=GROUP, message_thread_id=55, is_topic_message=True,
                             reply_to_message=topic_root), BOT_ID) is None


def test_largest_photo_is_chosen() -> None:
    sizes = [{"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90},
             {"file_id": "big", "file_unique_id": "b", "width": 1280, "height": 960,
              "file_size": 99},
             {"file_id": "mid", "file_unique_id": "m", "width": 320, "height": 240}]
    ref = media_ref(msg(chat=None, photo=sizes, caption="look"))
    assert ref is not None and (ref.file_id, ref.kind, ref.size) == ("big", "image", 99)


def test_errors_map_to_what_delivery_should_do() -> None:
    limited = map_errors(RetryAfter(timedelta(seconds=7)))
    assert limited.retry_after == 7 and not limited.permanent
    assert map_errors(Forbidden("Forbidden: bot was blocked by the user")).permanent
    assert map_errors(BadRequest("Bad Request: chat not found")).permanent
    for retryable in (NetworkError("boom"), TimedOut()):
        delivery = map_errors(retryable)
        assert not delivery.ok and not delivery.permanent and delivery.retry_after is None
    leaked = map_errors(NetworkError(f"POST /bot{TOKEN}/sendMessage failed"), [TOKEN])
    assert TOKEN not in (leaked.error or "")


def test_reply_parts_are_html_with_a_plain_twin() -> None:
    parts = plan_parts("**Hi** there\n\n" + "word " * 2000, [Media(kind="file", path="/x")])
    *texts, media = parts
    assert len(texts) >= 2
    assert texts[0].html is not None and texts[0].html.startswith("<b>Hi</b>")  # type: ignore[union-attr]
    assert texts[0].plain.startswith("Hi there")  # type: ignore[union-attr]
    assert all(len(parse_html(p.html)) <= 4096 for p in texts if p.html)  # type: ignore[union-attr]
    assert media.media.path == "/x"  # type: ignore[union-attr]


def test_secret_filter_rewrites_messages_arguments_and_tracebacks() -> None:
    secret_filter = SecretFilter(TOKEN)
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "POST %s", (f"/bot{TOKEN}/x",),
                               None)
    assert secret_filter.filter(record) and record.getMessage() == "POST /bot[token]/x"
    try:
        raise RuntimeError(f"token {TOKEN} refused")
    except RuntimeError:
        import sys
        record = logging.LogRecord("telegram.Bot", logging.ERROR, __file__, 1, "failed", None,
                                   sys.exc_info())
    secret_filter.filter(record)
    assert record.exc_text is not None and TOKEN not in record.exc_text


# --- config ---------------------------------------------------------------------------------

def config_errors(section: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"channels": {"telegram": section}}, env={})
    return dict(info.value.errors)


def test_config_names_what_is_missing() -> None:
    errors = config_errors({"enabled": True, "token": "${TELEGRAM_BOT_TOKEN:-}"})
    assert "required when channels.telegram.enabled is true" in \
        errors["channels.telegram.token"]
    errors = config_errors({"enabled": True, "token": "t", "mode": "webhook"})
    assert "webhook_url" in errors["channels.telegram"]
    errors = config_errors({"enabled": True, "token": "t", "poll_timeout": "60s"})
    assert "watchdog must be at least twice poll_timeout" in errors["channels.telegram"]
    errors = config_errors({"webhook_secret": "has spaces"})
    assert "channels.telegram.webhook_secret" in errors
    config = parse_config({"channels": {"telegram": {"allow_from": [123, "@ada"],
                                                     "allow_groups": [-100123]}}}, env={})
    telegram = config.channels.telegram
    assert telegram.allow_from == ["123", "@ada"] and telegram.allow_groups == ["-100123"]
    shown = repr(parse_config({"channels": {"telegram": {
        "token": "tok-value", "webhook_secret": "hook-value"}}}, env={}).channels.telegram)
    assert "tok-value" not in shown and "hook-value" not in shown


# --- access ---------------------------------------------------------------------------------

@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(tmp_path / "data" / "parley.db")
    try:
        yield opened
    finally:
        await opened.close()


def user(data: dict[str, Any]) -> User:
    return User.de_json(data, None)


async def test_access_policies(store: Store) -> None:
    pairing = PairingStore(store)

    def access(**settings: Any) -> Access:
        return Access(TelegramChannelConfig(**settings), pairing)

    ada, bob = user(ADA), user(BOB)
    group = Message.de_json({"message_id": 1, "date": 1, "chat": GROUP}, None).chat
    assert await access().direct(bob) == "pair"
    assert await access(allow_from=["@ADA"]).direct(ada) == "serve"
    assert await access(allow_from=["1002"], dm_policy="allowlist").direct(bob) == "serve"
    assert await access(dm_policy="allowlist").direct(bob) == "ignore"
    assert await access(dm_policy="open").direct(bob) == "serve"
    assert await access(dm_policy="disabled", allow_from=["1002"]).direct(bob) == "ignore"
    # groups: strangers only in listed groups; unaddressed messages are context
    assert await access().group(group, bob, addressed=True) == "context"
    assert await access(group_history=0).group(group, bob, addressed=True) == "ignore"
    assert await access(allow_groups=["-100123"]).group(group, bob, addressed=True) == "serve"
    assert await access(allow_from=["1002"]).group(group, bob, addressed=False) == "context"
    assert await access(allow_from=["1002"], group_policy="open").group(
        group, bob, addressed=False) == "serve"
    assert await access(allow_groups=["-100123"], group_policy="disabled").group(
        group, bob, addressed=True) == "ignore"
    code = await pairing.request("telegram", "1002")
    await pairing.approve("telegram", code.code)
    assert await access().direct(bob) == "serve"  # approved by the owner: no restart


# --- the adapter against the fake Bot API -----------------------------------------------------

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
                                  media_dir=tmp_path / "media", clock=clock or time.monotonic)
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
    assert channel._typing == {}


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
    assert Path(media.path or "").parent == tmp_path / "media"
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
    channel = TelegramChannel(config, bus=MessageBus(), store=store, media_dir=tmp_path)
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
