"""The Discord channel: pure translation rules, then the adapter against the fake Discord (the
real discord.py talking to ``tests/fakes/discord_server.py``). Who is served is the shared
policy's, tested in ``test_access``."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from channels.common import SecretFilter
from channels.discord import DiscordChannel, DiscordChannelError
from channels.discord_convert import (
    FilePart,
    Post,
    TextPart,
    addressing,
    allowed_mentions,
    attachment,
    discord,
    incoming,
    map_errors,
    message_text,
    nonce_for,
    place_of,
    plan_parts,
    stored_name,
    too_big_reply,
)
from channels.inbound import PUBLISH_ATTEMPTS
from channels.incoming import Incoming, to_inbound
from gateway.kernel.backoff import BackoffPolicy
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import ConfigError, DiscordChannelConfig, parse_config
from gateway.kernel.events import Media, OutboundMessage
from gateway.kernel.store import Store
from tests.channels.test_telegram import FlakyBus
from tests.fakes.discord_server import BOT_ID, TOKEN, FakeDiscord

BOT = str(BOT_ID)
ADA, BOB = "310000000000001001", "310000000000001002"
GUILD, GENERAL, THREAD = "320000000000005000", "330000000000006000", "340000000000007000"
BOT_ROLE = "320000000000005001"
WHEN = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def inc(content: str = "hello", **extra: Any) -> Post:
    """A server message from Ada in #general, unless told otherwise."""
    data: dict[str, Any] = {"id": "360000000000000001", "channel_id": GENERAL,
                            "guild_id": GUILD, "parent_id": None, "author_id": ADA,
                            "author_name": "Ada", "author_is_bot": False, "content": content,
                            "created_at": WHEN}
    data.update(extra)
    return Post(**data)


def dm(content: str = "hello", **extra: Any) -> Post:
    return inc(content, channel_id="370000000000000001", guild_id=None, **extra)


def converted(post: Post) -> Incoming:
    """What the shared pipeline gets for ``post``."""
    found = incoming(post, bot_id=BOT)
    assert found is not None
    return found


# --- translation ----------------------------------------------------------------------------

def test_places_and_session_keys() -> None:
    assert place_of(dm()).chat_type == "direct"
    assert to_inbound(converted(dm()), text="x").session_key == "discord:370000000000000001"
    assert to_inbound(converted(inc()), text="x").session_key == f"discord:{GENERAL}"
    in_thread = inc(channel_id=THREAD, parent_id=GENERAL)
    msg = to_inbound(converted(in_thread), text="x")
    assert (msg.chat_id, msg.thread_id, msg.chat_type) == (GENERAL, THREAD, "group")
    assert msg.session_key == f"discord:{GENERAL}:{THREAD}"


@pytest.mark.parametrize(("message", "mention", "reply"), [
    (inc(f"<@{BOT}> hi", mentions=((BOT, "Parley"),)), True, False),
    (inc(f"<@!{BOT}> hi"), True, False),  # the old nickname form, in the text only
    (inc(f"<@&{BOT_ROLE}> hi", role_mentions=(BOT_ROLE,)), True, False),
    (inc(f"<@{BOB}> hi", mentions=((BOB, "Bob"),)), False, False),
    (inc("sure", reply_to="1", reply_author_id=BOT), False, True),
    (inc("sure", reply_to="1", reply_author_id=BOT, author_is_bot=True), False, False),
    (inc("@everyone hi"), False, False),
])
def test_who_addressed_the_bot(message: Post, mention: bool, reply: bool) -> None:
    found = addressing(message, bot_id=BOT, bot_roles=(BOT_ROLE,))
    assert (found.mention, found.reply) == (mention, reply)


def test_what_the_agent_reads() -> None:
    text = message_text(inc(f"<@{BOT}>, ask <@{BOB}> and <@&99> about it",
                            mentions=((BOT, "Parley"), (BOB, "Bob")),
                            role_names=(("99", "Crew"),)), bot_id=BOT)
    assert text == "ask @Bob and @Crew about it"
    replying = inc("what does this mean?", reply_to="5", reply_author_id=BOT,
                   reply_author_name="Parley", reply_text="Use   a\nmutex.")
    assert message_text(replying, bot_id=BOT) == \
        '[Replying to you: "Use a mutex."]\nwhat does this mean?'
    command = inc(f"<@{BOT}> /status", reply_to="5", reply_text="x")
    msg = to_inbound(converted(command), text=message_text(command, bot_id=BOT))
    assert msg.text == "/status" and msg.kind == "command"
    context = to_inbound(converted(inc()), text="hello", context_only=True)
    assert context.context_only and context.sender_name == "Ada"


def test_replies_are_cut_under_2000_outside_code_and_files_follow() -> None:
    code = "\n".join(f"line {i}" for i in range(400))
    text = "intro\n\n" + "word " * 500 + f"\n\n```py\n{code}\n```\n\n@everyone `@here` done"
    media = Media(kind="file", path="/tmp/a.txt")
    parts = plan_parts(text, [media])
    texts = [p.content for p in parts if isinstance(p, TextPart)]
    assert parts[-1] == FilePart(media) and len(texts) == len(parts) - 1 >= 3
    assert all(len(t) <= 2000 and t.count("```") % 2 == 0 for t in texts)
    assert sum(t.count("line 17\n") for t in texts) == 1
    assert texts[-1].endswith("@\u200beveryone `@here` done")  # code stays as written
    assert plan_parts(text, [media]) == parts  # a retry plans the same parts


def test_nonces_and_mentions() -> None:
    first = nonce_for("key", 0)
    assert len(first) <= 25 and first == nonce_for("key", 0) != nonce_for("key", 1)
    none = allowed_mentions(allow_mentions=False, reply_ping=False).to_dict()
    assert none == {"parse": []}
    some = allowed_mentions(allow_mentions=True, reply_ping=True).to_dict()
    assert sorted(some["parse"]) == ["roles", "users"] and some["replied_user"] is True


def _http_error(cls: type[discord.HTTPException], status: int, code: int = 0) -> Exception:
    response = SimpleNamespace(status=status, reason="x", headers={})
    return cls(response, {"code": code, "message": "m"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("exc", "retry_after", "permanent"), [
    (discord.RateLimited(2.5), 2.5, False),
    (_http_error(discord.Forbidden, 403, 50013), None, True),
    (_http_error(discord.NotFound, 404, 10003), None, True),
    (_http_error(discord.HTTPException, 400, 50035), None, True),
    (_http_error(discord.DiscordServerError, 503), None, False),
    (_http_error(discord.HTTPException, 429), 60.0, False),  # Cloudflare: no retry_after
    (aiohttp.ServerDisconnectedError(), None, False),
    (TimeoutError(), None, False),
])
def test_errors_map_to_what_the_outbox_does(exc: Exception, retry_after: float | None,
                                            permanent: bool) -> None:
    delivery = map_errors(exc, (TOKEN,))
    assert not delivery.ok
    assert (delivery.retry_after, delivery.permanent) == (retry_after, permanent)


def test_files_and_refusals() -> None:
    assert stored_name("9", 0, "../../etc/pass wd") == "9-0-etc_pass_wd"
    assert stored_name("9", 1, "..") == "9-1-file"
    big = attachment("film.mp4", 30 * 1024 * 1024, "video/mp4", "u")
    assert too_big_reply([big], 25 * 1024 * 1024) == (
        "Sorry, that file is too big for me: film.mp4 (30 MB). I can take files up to 25 MB.")


def test_the_token_never_reaches_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.discord.redact")
    logger.addFilter(SecretFilter(TOKEN))
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("IDENTIFY with %s", TOKEN)
        try:
            raise RuntimeError(f"Bot {TOKEN}")
        except RuntimeError:
            logger.exception("failed")
    assert TOKEN not in caplog.text and "[token]" in caplog.text


def test_config_rules() -> None:
    def parse(**section: Any) -> DiscordChannelConfig:
        return parse_config({"channels": {"discord": section}}, env={}).channels.discord

    with pytest.raises(ConfigError, match="Reset Token"):
        parse(enabled=True)
    with pytest.raises(ConfigError, match="Copy ID"):
        parse(allow_from=["@ada"])
    config = parse(enabled=True, token="t", allow_from=[int(ADA)], api_base="http://x/api/")
    assert config.allow_from == [ADA] and config.api_base == "http://x/api"
    assert config.max_media_bytes == 25 * 1024 * 1024 and config.dm_policy == "pairing"



# --- the adapter against the fake Discord --------------------------------------------------

@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5) as server:
        server.user(int(ADA), "ada", global_name="Ada")
        server.text_channel(server.guild(int(GUILD), "Guild"), int(GENERAL), "general")
        yield server


def channel_for(dc: FakeDiscord, store: Store, tmp_path: Path, **settings: Any
                ) -> DiscordChannel:
    config = DiscordChannelConfig(**{"enabled": True, "token": dc.token,
                                     "api_base": dc.api_base, "connect_timeout": 5.0,
                                     **settings})
    return DiscordChannel(config, bus=MessageBus(), store=store, workspace=tmp_path / "ws")


async def test_a_refused_token_stops_the_start(dc: FakeDiscord, store: Store,
                                              tmp_path: Path) -> None:
    channel = channel_for(dc, store, tmp_path, token="not-the-token")
    with pytest.raises(DiscordChannelError, match="Reset Token"):
        await channel.start()
    await channel.stop()  # safe again


async def test_an_unreachable_discord_does_not_block_the_start(store: Store,
                                                               tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = DiscordChannelConfig(enabled=True, token="t", connect_timeout=30.0,
                                  api_base=f"http://127.0.0.1:{port}/api/v10")
    channel = DiscordChannel(config, bus=MessageBus(), store=store, workspace=tmp_path)
    await channel.start()  # returns at the first failed login, long before connect_timeout
    status = channel.status()
    assert not status.running and status.detail["degraded"] is True
    msg = OutboundMessage(channel="discord", chat_id=GENERAL, text="hi")
    delivery = await channel.send(msg)
    assert not delivery.ok and delivery.retry_after == 5.0  # the outbox tries again later
    await channel.stop()


async def test_a_failed_part_resumes_without_sending_twice(
        dc: FakeDiscord, store: Store, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    channel = channel_for(dc, store, tmp_path)
    await channel.start()
    try:
        assert channel.status().running
        logging.getLogger("discord.http").warning("sending with %s", dc.token)
        assert dc.token not in caplog.text  # discord.py's loggers are filtered
        text = "\n\n".join(f"paragraph {i} " + "x" * 1500 for i in range(3))
        msg = OutboundMessage(channel="discord", chat_id=GENERAL, text=text, reply_to="1")
        dc.fail_next("create_message", 503, skip=1)
        first = await channel.send(msg)
        assert not first.ok and not first.permanent
        second = await channel.send(msg)
        assert second.ok and len(second.message_ids) == 3
        sent = dc.sent_to(GENERAL)
        assert [s.content.split()[1] for s in sent] == ["0", "1", "2"]  # each part once
        bad = await channel.send(replace(msg, chat_id="general", idempotency_key="k2"))
        assert bad.permanent
    finally:
        await channel.stop()
    assert not channel.status().running


async def test_a_message_that_cannot_be_stored_is_tried_again_not_dropped(
        dc: FakeDiscord, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More failures than one round of tries (a full disk): Discord never offers a message
    again, so the reader keeps it until it is stored."""
    bus = FlakyBus(failures=PUBLISH_ATTEMPTS + 2)
    config = DiscordChannelConfig(enabled=True, token=dc.token, api_base=dc.api_base,
                                  connect_timeout=5.0, dm_policy="open")
    channel = DiscordChannel(config, bus=bus, store=store, workspace=tmp_path / "ws")
    monkeypatch.setattr(channel._inbound, "_retry", BackoffPolicy(base=0.001, cap=0.001))
    await channel.start()
    try:
        dc.post(dc.dm_channel(dc.user(7, "ada")), dc.user(7, "ada"), "do not lose me")
        received = await asyncio.wait_for(bus.consume_inbound(), 10)
        assert received.text == "do not lose me" and bus.failures == 0
    finally:
        await channel.stop()
