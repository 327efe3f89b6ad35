"""The Slack channel against the fake Slack (Web API + Socket Mode) on loopback, through the
real slack-sdk: the contract kit, then DMs, mention gating, threads, mrkdwn and fence-safe
splitting, files in and out, pairing, reactions, 429, reconnects and liveness."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from channels.base import Channel
from channels.slack import SlackChannel, SlackChannelError
from gateway.kernel import channel_registry
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import ConfigError, parse_config
from gateway.kernel.config_channels import SlackChannelConfig
from gateway.kernel.events import ChatActivity, Media, OutboundMessage
from gateway.kernel.inbox_files import inbox_path
from gateway.kernel.store import Store
from parley.testing import CHECKS, ChannelContract
from tests.fakes.slack_server import BOT_USER, FakeSlack

OWNER = "U0OWNER"


def section(slack: FakeSlack, **extra: Any) -> SlackChannelConfig:
    return SlackChannelConfig(**{"enabled": True, "bot_token": slack.bot_token,
                                 "app_token": slack.app_token, "api_base": slack.api_base,
                                 "ping_interval": 0.2, **extra})


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


# --- the contract kit ---------------------------------------------------------------------------

class SlackFake:
    pairing = True
    not_applicable: dict[str, str] = {}

    def __init__(self, slack: FakeSlack) -> None:
        self.slack = slack

    def section(self, *, owner: str) -> SlackChannelConfig:
        return section(self.slack, allow_from=[owner])

    def attach(self, channel: Channel) -> None:
        return None

    def chat_of(self, user: str) -> str:
        return f"D{user}"

    async def user_says(self, user: str, text: str) -> None:
        await self.slack.say(user, self.chat_of(user), text)

    async def bot_messages(self, chat_id: str, count: int) -> list[str]:
        return [p.text for p in await self.slack.wait_posts(chat_id, count)]

    async def fail_sends(self) -> None:
        self.slack.refuse_posts = True


@pytest.mark.parametrize("check", CHECKS)
async def test_slack_passes_the_kit(check: str, slack: FakeSlack, tmp_path: Path) -> None:
    async with ChannelContract(channel_registry.load("slack"), SlackFake(slack),
                               tmp_path) as kit:
        assert await kit.run(check) == "ok"


# --- one channel on a bus -----------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def running(slack: FakeSlack, tmp_path: Path, clock: Clock | None = None,
                  **extra: Any) -> AsyncIterator[tuple[SlackChannel, MessageBus, Store]]:
    store = await Store.open(tmp_path / "parley.db")
    bus = MessageBus()
    bus.attach_store(store, lambda kind: 600.0)
    channel = SlackChannel(section(slack, allow_from=[OWNER], **extra), bus=bus, store=store,
                           workspace=tmp_path / "ws", clock=clock or Clock())
    await channel.start()
    try:
        yield channel, bus, store
    finally:
        await channel.stop()
        await store.close()


async def test_a_dm_reaches_the_bus_and_the_reply_comes_back(slack: FakeSlack,
                                                           tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        assert channel.status().state == "connected"
        ts = await slack.say(OWNER, "D1", "hello &amp; welcome")
        msg = await bus.consume_inbound()
        assert (msg.session_key, msg.text, msg.trust, msg.message_id, msg.sender_name) == \
            ("slack:D1", "hello & welcome", "owner", ts, f"name-{OWNER}")
        delivery = await channel.send(OutboundMessage(channel="slack", chat_id="D1",
                                                      text="**Hi** there", reply_to=ts))
        assert delivery.ok
        [post] = await slack.wait_posts("D1")
        assert post.text == "*Hi* there" and post.thread_ts is None


async def test_channels_answer_mentions_only_and_keep_the_chatter(slack: FakeSlack,
                                                                  tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        await slack.say("U2", "C1", "lunch anyone?", channel_type="channel")
        await slack.say(OWNER, "C1", "not for the bot", channel_type="channel")
        assert bus.inbound_size == 0
        await slack.say(OWNER, "C1", f"<@{BOT_USER}> what did they ask?",
                        channel_type="channel")
        first, second, third = [await bus.consume_inbound() for _ in range(3)]
        assert (first.context_only, second.context_only, third.context_only) == \
            (True, True, False)  # the chatter comes along as context, before the question
        assert third.text == "what did they ask?" and third.mentioned
        assert third.chat_type == "group" and third.session_key == "slack:C1"
        assert "lunch anyone?" in first.text


async def test_a_thread_is_a_session_and_is_answered_in_the_thread(slack: FakeSlack,
                                                                   tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        parent = slack.next_ts()
        await slack.say(OWNER, "C1", f"<@{BOT_USER}> in a thread", channel_type="channel",
                        thread_ts=parent)
        msg = await bus.consume_inbound()
        assert msg.thread_id == parent and msg.session_key == f"slack:C1:{parent}"
        await channel.send(OutboundMessage(channel="slack", chat_id="C1", text="threaded",
                                           thread_id=parent))
        [post] = await slack.wait_posts("C1")
        assert post.thread_ts == parent


async def test_long_replies_are_split_fence_safe_in_mrkdwn(slack: FakeSlack,
                                                           tmp_path: Path) -> None:
    code = "\n".join(f"print({i}) # <{i}> & more" for i in range(400))
    text = f"Here is **the code**:\n\n```python\n{code}\n```\n\nSee [docs](https://x.y/z)."
    async with running(slack, tmp_path) as (channel, _, _):
        delivery = await channel.send(OutboundMessage(channel="slack", chat_id="D1", text=text))
        assert delivery.ok and len(delivery.message_ids) >= 3
        posts = [p.text for p in await slack.wait_posts("D1", len(delivery.message_ids))]
    assert all(len(p) <= 4000 for p in posts)
    assert all(p.count("```") % 2 == 0 for p in posts)  # every part closes its fence
    assert posts[0].startswith("Here is *the code*:")
    assert posts[-1].endswith("See <https://x.y/z|docs>.")
    lines = [x for p in posts for x in p.splitlines() if x.startswith("print(")]
    assert lines == [f"print({i}) # &lt;{i}&gt; &amp; more" for i in range(400)]


async def test_files_in_are_downloaded_with_the_bot_token(slack: FakeSlack,
                                                          tmp_path: Path) -> None:
    async with running(slack, tmp_path, max_media_bytes=100) as (channel, bus, _):
        small = slack.file("notes.txt", b"remember the milk")
        big = slack.file("big.bin", b"x" * 500, "application/octet-stream")
        await slack.say(OWNER, "D1", "two files", files=[small, big])
        msg = await bus.consume_inbound()
    [media] = msg.media
    assert Path(media.path or "").read_bytes() == b"remember the milk"
    assert Path(media.path or "").parent == inbox_path(tmp_path / "ws", "slack", "D1")
    assert 'shared "big.bin" (500 bytes), which was not downloaded' in msg.text
    assert slack.download_auth == [f"Bearer {slack.bot_token}"]
    [notice] = await slack.wait_posts("D1")
    assert "big.bin" in notice.text and "100 bytes" in notice.text


async def test_files_out_are_uploaded(slack: FakeSlack, tmp_path: Path) -> None:
    report = tmp_path / "report.csv"
    report.write_bytes(b"a,b\n1,2\n")
    async with running(slack, tmp_path) as (channel, _, _):
        delivery = await channel.send(OutboundMessage(
            channel="slack", chat_id="D1", text="Your report",
            media=(Media(kind="file", path=str(report)),)))
        assert delivery.ok
        text, upload = await slack.wait_posts("D1", 2)
    assert text.text == "Your report"
    assert [f["title"] for f in upload.files] == ["report.csv"]
    assert list(slack.uploads.values()) == [b"a,b\n1,2\n"]


async def test_a_stranger_pairs_then_is_served_as_a_member(slack: FakeSlack,
                                                           tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        await slack.say("U9", "D9", "hi")
        [notice] = await slack.wait_posts("D9")
        code = re.search(r"pairing code: (\w+)", notice.text)
        assert code and "parley pairing approve slack" in notice.text
        assert bus.inbound_size == 0
        await channel.pairing.approve("slack", code.group(1))
        await slack.say("U9", "D9", "hi again")
        msg = await bus.consume_inbound()
        assert (msg.text, msg.trust) == ("hi again", "member")


async def test_the_answered_message_wears_eyes_while_its_turn_runs(slack: FakeSlack,
                                                                  tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        ts = await slack.say(OWNER, "D1", "think hard")
        await bus.consume_inbound()
        channel.activity(ChatActivity(channel="slack", chat_id="D1", busy=True))
        await slack.wait_for(lambda: len(slack.reactions) == 1)
        channel.activity(ChatActivity(channel="slack", chat_id="D1", busy=False))
        await slack.wait_for(lambda: len(slack.reactions) == 2)
    assert slack.reactions == [("add", "D1", ts, "eyes"), ("remove", "D1", ts, "eyes")]


async def test_429_tells_retry_after_and_the_retry_resumes(slack: FakeSlack,
                                                          tmp_path: Path) -> None:
    text = "\n\n".join(f"paragraph {i} " + "word " * 150 for i in range(8))
    async with running(slack, tmp_path) as (channel, _, _):
        msg = OutboundMessage(channel="slack", chat_id="D1", text=text)
        slack.fail_next("chat.postMessage", "ratelimited", status=429, retry_after=7)
        limited = await channel.send(msg)
        assert (limited.ok, limited.retry_after) == (False, 7.0)
        first = await channel.send(msg)
        assert first.ok
        n = len(first.message_ids)
        # A failure midway: the retry sends only the parts not yet delivered.
        slack.posts.clear()
        again = OutboundMessage(channel="slack", chat_id="D2", text=text)
        await slack_fail_after_one(slack)
        partial = await channel.send(again)
        assert not partial.ok and not partial.permanent
        done = await channel.send(again)
        assert done.ok and len(done.message_ids) == n
        assert len(slack.posts["D2"]) == n  # no part twice
        slack.fail_next("chat.postMessage", "channel_not_found")
        gone = await channel.send(OutboundMessage(channel="slack", chat_id="C404", text="x"))
        assert gone.permanent and gone.error == "channel_not_found"


async def slack_fail_after_one(slack: FakeSlack) -> None:
    """The second post of the next message fails."""
    original = slack._m_chat_postMessage
    calls = 0

    async def flaky(args: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 2:
            slack._m_chat_postMessage = original  # type: ignore[method-assign]
            return {"error": "internal_error"}
        return await original(args)

    slack._m_chat_postMessage = flaky  # type: ignore[method-assign]


async def test_reconnects_after_a_disconnect_and_a_dropped_socket(slack: FakeSlack,
                                                                  tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        assert slack.connections == 1
        await slack.disconnect()
        await slack.wait_for(lambda: slack.connections == 2)
        await channel.wait_until(lambda c: c.status().state == "connected")
        await slack.drop()
        await slack.wait_for(lambda: slack.connections == 3)
        await channel.wait_until(lambda c: c.status().state == "connected")
        assert slack.calls.count("apps.connections.open") == 3
        await slack.say(OWNER, "D1", "still there?")
        assert (await bus.consume_inbound()).text == "still there?"
        assert channel.status().detail["disconnects"] >= 1


async def test_never_connected_while_deaf(slack: FakeSlack, tmp_path: Path) -> None:
    clock = Clock()
    async with running(slack, tmp_path, clock, watchdog=60) as (channel, _, _):
        assert channel.status().state == "connected"
        slack.echo = False  # the socket stays open, and hears nothing any more
        assert (await channel.send(OutboundMessage(channel="slack", chat_id="D1",
                                                   text="anyone?"))).ok
        clock.now += 61
        status = channel.status()
        assert status.state == "degraded" and "after a send" in (status.reason or "")
        slack.echo = True
        await channel.send(OutboundMessage(channel="slack", chat_id="D1", text="echo now"))
        await channel.wait_until(lambda c: c.status().state == "connected")


async def test_refused_tokens_fail_the_start_naming_the_key(slack: FakeSlack,
                                                            tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "parley.db")
    try:
        for key in ("bot_token", "app_token"):
            wrong = "xoxb-wrong" if key == "bot_token" else "xapp-wrong"
            channel = SlackChannel(section(slack, **{key: wrong}), bus=MessageBus(),
                                   store=store, workspace=tmp_path)
            with pytest.raises(SlackChannelError, match=rf"channels\.slack\.{key} refused by "
                                                        r"Slack \(.*invalid_auth\)"):
                await channel.start()
            await channel.stop()
    finally:
        await store.close()


def test_config_names_the_missing_token() -> None:
    with pytest.raises(ConfigError, match=r"channels\.slack\.bot_token: required when"):
        parse_config({"channels": {"slack": {"enabled": True, "app_token": "xapp-1"}}},
                     env={})
    with pytest.raises(ConfigError, match=r"channels\.slack\.app_token: a Slack app token "
                                          r"starts with xapp-"):
        parse_config({"channels": {"slack": {"app_token": "xoxb-1"}}}, env={})


async def test_an_envelope_delivered_again_is_taken_once(slack: FakeSlack,
                                                         tmp_path: Path) -> None:
    """Slack delivers an envelope again when its acknowledgement was lost: the inbox takes
    the message once."""
    async with running(slack, tmp_path) as (channel, bus, _):
        ts = await slack.say(OWNER, "D1", "only once")
        await slack.say(OWNER, "D1", "only once", ts=ts)
        await slack.say(OWNER, "D1", "next")
        assert [(await bus.consume_inbound()).text for _ in range(2)] == ["only once", "next"]
        assert bus.duplicates == 1


async def test_a_sender_without_a_profile_is_named_from_users_info_once(
        slack: FakeSlack, tmp_path: Path) -> None:
    async with running(slack, tmp_path) as (channel, bus, _):
        await slack.say(OWNER, "D1", "one", profile=False)
        await slack.say(OWNER, "D1", "two", profile=False)
        names = [(await bus.consume_inbound()).sender_name for _ in range(2)]
    assert names == [f"name-{OWNER}"] * 2
    assert slack.calls.count("users.info") == 1
