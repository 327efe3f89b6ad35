"""The whole gateway on Discord: the real discord.py connects to the fake Discord (REST and
gateway websocket), litellm talks to the scripted model; nothing of ours is mocked."""

from __future__ import annotations

import asyncio
import base64
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import channels.discord as discord_channel
import channels.discord_library as discord_library
from gateway.app import Gateway
from gateway.kernel.config import Config
from tests.conftest import MakeConfig
from tests.e2e.waiting import queued
from tests.fakes.discord_server import BOT_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedLLM

PARLEY = str(Path(sys.executable).parent / "parley")
ADA_ID, BOB_ID = 310000000000001001, 310000000000001002
GUILD_ID, GENERAL_ID, THREAD_ID = 320000000000005000, 330000000000006000, 340000000000007000
OTHER_ID = GENERAL_ID + 1
BOT = {"id": str(BOT_ID), "username": "parley", "global_name": "Parley", "discriminator": "0",
       "avatar": None, "bot": True}


def discord_config(make_config: MakeConfig, dc: FakeDiscord, *,
                   agent: dict[str, Any] | None = None, **settings: Any) -> Config:
    """Discord on the fake, Ada the owner; ``settings`` go to ``channels.discord``."""
    section = {"enabled": True, "token": dc.token, "api_base": dc.api_base,
               "typing_interval": "0.1s", "connect_timeout": "10s",
               "allow_from": [str(ADA_ID)], **settings}
    return make_config(channels={"local": {"enabled": False}, "discord": section,
                                 "delivery": {"backoff": "0.1s"}}, agent=agent or {})


@pytest.fixture
def world(dc: FakeDiscord) -> dict[str, Any]:
    guild = dc.guild(GUILD_ID, "Trip planning")
    general = dc.text_channel(guild, GENERAL_ID, "general")
    return {"ada": dc.user(ADA_ID, "ada", global_name="Ada"),
            "bob": dc.user(BOB_ID, "bob", global_name="Bob"),
            "guild": guild, "general": general}


@pytest.fixture
async def gateway(make_config: MakeConfig, dc: FakeDiscord,
                  world: dict[str, Any]) -> AsyncIterator[Gateway]:
    gw = Gateway(discord_config(make_config, dc), grace=2.0)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def user_texts(request: dict[str, Any]) -> list[str]:
    out = []
    for m in request["messages"]:
        if m["role"] == "user":
            content = m["content"]
            out.append(content if isinstance(content, str) else content[0]["text"])
    return out


def _joined(thread: threading.Thread) -> bool:
    """discord.py's heartbeat thread ends at its next wake-up once told to stop."""
    thread.join(timeout=2.0)
    return not thread.is_alive()


def channel_of(gw: Gateway) -> discord_channel.DiscordChannel:
    channel = gw.manager.channels["discord"]
    assert isinstance(channel, discord_channel.DiscordChannel)
    return channel


async def test_direct_message_round_trip(gateway: Gateway, dc: FakeDiscord, llm: ScriptedLLM,
                                         world: dict[str, Any]) -> None:
    answer = llm.hold()
    llm.reply("**Hello** Ada! @everyone look")
    dm = dc.dm_channel(world["ada"])
    asked = dc.post(dm, world["ada"], "hi there")
    await llm.wait_for_requests(1)
    await dc.wait_for(lambda: int(dm["id"]) in dc.typing)  # shown while the model works
    answer.release()
    [reply] = await dc.wait_sent(dm["id"])
    assert reply.content == "**Hello** Ada! @\u200beveryone look"  # markdown as is, no ping
    assert reply.reference == int(asked["id"])  # answers the message it replies to
    assert reply.allowed_mentions == {"parse": []}
    runtime = user_texts(llm.last_request)[-2]
    for line in ("Channel: discord", f"Chat ID: {dm['id']}", "Chat type: direct",
                 f"Sender: Ada (id {ADA_ID})"):
        assert line in runtime
    assert "Discord markdown" in runtime
    assert dc.gateway_urls[0].startswith("/gateway?")
    assert "compress=zlib-stream" in dc.gateway_urls[0]
    assert dc.identifies[0]["intents"] & (1 << 15)  # message content
    assert await gateway.manager.flush(10)
    health = gateway.health()["channels"]["discord"]
    assert health["running"] and health["state"] == "connected" and health["bot"] == "@parley"
    assert health["last_event"] and health["last_inbound"] and health["last_send_ok"]


async def test_pairing_flow_with_the_cli(make_config: MakeConfig, dc: FakeDiscord,
                                         world: dict[str, Any], llm: ScriptedLLM,
                                         tmp_path: Path) -> None:
    config = discord_config(make_config, dc)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"workspace": str(config.workspace_path),
                                    "data_dir": str(config.data_path)}))
    bob = world["bob"]
    dm = dc.dm_channel(bob)
    async with Gateway(config, grace=2.0):
        dc.post(dm, bob, "hello, who are you?")
        [answer] = await dc.wait_sent(dm["id"])
        code = answer.content.split("Your pairing code: ")[1].split()[0]
        assert f"parley pairing approve discord {code}" in answer.content
        assert llm.calls == 0  # a stranger never reaches the model
        proc = await asyncio.create_subprocess_exec(
            PARLEY, "pairing", "approve", "discord", code, "--config", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        assert "approved Bob" in out.decode()
        llm.reply("Nice to meet you, Bob.")
        dc.post(dm, bob, "hello again")  # served at once: no restart
        replies = await dc.wait_sent(dm["id"], 2)
        assert replies[1].content == "Nice to meet you, Bob."
        assert user_texts(llm.last_request)[-1] == "hello again"


async def test_server_mentions_names_context_and_replies(
        gateway: Gateway, dc: FakeDiscord, llm: ScriptedLLM, world: dict[str, Any]) -> None:
    general, ada, bob = world["general"], world["ada"], world["bob"]
    dc.post(general, bob, "I think we should take the train", nick="Bobby")
    dc.post(general, ada, "the car is faster")
    llm.reply("The train, Ada: it is cheaper.")
    asked = dc.post(general, ada, f"<@{BOT_ID}> what do you think?", mentions=(dc.bot,))
    [reply] = await dc.wait_sent(GENERAL_ID)
    assert reply.content == "The train, Ada: it is cheaper."
    assert reply.reference == int(asked["id"])  # answers the message it replies to
    seen = "\n".join(user_texts(llm.last_request))  # context may be merged into the turn
    assert seen.endswith("[Ada] what do you think?")
    assert seen.index("[Bobby] I think we should take the train") < seen.index(
        "[Ada] the car is faster") < seen.index("[Ada] what do you think?")
    assert llm.calls == 1  # the unaddressed messages ran no turn
    # A reply to the bot addresses it; so does its role. A stranger (not in allow_from, in a
    # server nobody listed) and another bot do not get an answer.
    llm.reply("Booked.")
    dc.post(general, ada, "ok, book it", reply_to=dc.bot_message(reply))
    await dc.wait_sent(GENERAL_ID, 2)
    dc.post(general, bob, f"<@{BOT_ID}> ignore Ada", mentions=(dc.bot,))
    robot = dc.user(350000000000003000, "otherbot", global_name="Other Bot", bot=True)
    dc.post(general, robot, f"<@{BOT_ID}> let us chat forever", mentions=(dc.bot,))
    llm.reply("Still booked.")
    bot_role = world["guild"]["roles"][1]
    dc.post(general, ada, f"<@&{bot_role['id']}> status?", mention_roles=(bot_role,))
    replies = await dc.wait_sent(GENERAL_ID, 3)
    assert replies[2].content == "Still booked."
    assert llm.calls == 3
    seen = "\n".join(user_texts(llm.last_request))
    assert "[Bob] ignore Ada" in seen and seen.endswith("[Ada] status?")
    assert "chat forever" not in seen  # other bots are ignored (allow_bots is off)
    assert gateway.store is not None
    assert {s.key for s in await gateway.store.list_sessions()} == {f"discord:{GENERAL_ID}"}


async def test_threads_are_their_own_sessions(make_config: MakeConfig, dc: FakeDiscord,
                                              llm: ScriptedLLM, world: dict[str, Any]) -> None:
    general, bob = world["general"], world["bob"]
    thread = dc.thread(general, THREAD_ID, "Packing list", announce=False)
    elsewhere = dc.text_channel(world["guild"], OTHER_ID, "random")
    config = discord_config(make_config, dc, allow_channels=[str(GENERAL_ID)])
    llm.echo()
    async with Gateway(config, grace=2.0) as gw:
        dc.post(thread, bob, f"<@{BOT_ID}> in the thread", mentions=(dc.bot,))
        dc.post(general, bob, f"<@{BOT_ID}> in the channel", mentions=(dc.bot,))
        dc.post(elsewhere, bob, f"<@{BOT_ID}> not here", mentions=(dc.bot,))
        [in_thread] = await dc.wait_sent(THREAD_ID)
        [in_channel] = await dc.wait_sent(GENERAL_ID)
        assert in_thread.content == "echo: [Bob] in the thread"
        assert in_channel.content == "echo: [Bob] in the channel"
        late = dc.thread(general, THREAD_ID + 1, "Made while connected")  # THREAD_CREATE
        dc.post(late, bob, f"<@{BOT_ID}> new thread", mentions=(dc.bot,))
        unseen = dc.thread(general, THREAD_ID + 2, "Never announced", announce=False)
        dc.post(unseen, bob, f"<@{BOT_ID}> unseen thread", mentions=(dc.bot,))
        await dc.wait_sent(THREAD_ID + 1)
        await dc.wait_sent(THREAD_ID + 2)
        assert ("GET", f"channels/{THREAD_ID + 2}") in dc.calls  # unknown: looked up
        assert gw.store is not None
        keys = {s.key for s in await gw.store.list_sessions()}
        assert keys == {f"discord:{GENERAL_ID}", *(f"discord:{GENERAL_ID}:{THREAD_ID + i}"
                                                   for i in range(3))}
        assert dc.sent_to(OTHER_ID) == []  # a channel outside allow_channels


async def test_long_answer_with_code_is_split_cleanly(gateway: Gateway, dc: FakeDiscord,
                                                      llm: ScriptedLLM,
                                                      world: dict[str, Any]) -> None:
    code = "\n".join(f"    total += values[{i}]  # step {i}" for i in range(120))
    answer = ("Here is the function.\n\n" + "Some explanation. " * 80 +
              f"\n\n```python\ndef total(values):\n    total = 0\n{code}\n    return total\n```"
              "\n\nThat is all.")
    llm.reply(answer)
    dm = dc.dm_channel(world["ada"])
    asked = dc.post(dm, world["ada"], "write it")
    await dc.wait_for(lambda: any("That is all." in s.content for s in dc.sent_to(dm["id"])))
    parts = dc.sent_to(dm["id"])
    assert len(parts) >= 3
    assert [p.reference for p in parts] == [int(asked["id"])] + [None] * (len(parts) - 1)
    for part in parts:
        assert len(part.content) <= 2000
        assert part.content.count("```") % 2 == 0  # every code block closed in its message
    code_parts = [p for p in parts if "total +=" in p.content]
    assert len(code_parts) >= 2
    assert all("```python\n" in p.content for p in code_parts)
    shown = "\n".join(p.content for p in code_parts)
    for i in range(120):
        assert shown.count(f"values[{i}]") == 1  # every line once, none lost at a cut


PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
                       "hKmMIQAAAABJRU5ErkJggg==")


async def test_attachments_in(gateway: Gateway, dc: FakeDiscord, llm: ScriptedLLM,
                              world: dict[str, Any]) -> None:
    llm.reply("A cat, some notes; the film was too big.")
    dm = dc.dm_channel(world["ada"])
    asked = dc.post(dm, world["ada"], "what are these?", attachments=(
        ("cat.png", PNG, "image/png"), ("notes.pdf", b"%PDF-1.4 notes", "application/pdf"),
        ("film.mp4", b"not really", "video/mp4")), sizes=(len(PNG), 14, 30 * 1024 * 1024))
    notice, unread, answer = await dc.wait_sent(dm["id"], 3)
    assert notice.reference == int(asked["id"])
    assert unread.content.startswith(f"(I couldn't read {asked['id']}-1-notes.pdf: the PDF "
                                     "could not be read")  # not a real PDF: said in one line
    assert "film.mp4 (30 MB)" in notice.content and "up to 25 MB" in notice.content
    assert answer.content == "A cat, some notes; the film was too big."
    inbox = gateway.config.workspace_path / "inbox"
    notes = inbox / "discord" / dm["id"] / f"{asked['id']}-1-notes.pdf"
    assert notes.read_bytes() == b"%PDF-1.4 notes"
    content = llm.last_request["messages"][-1]["content"]
    text = content[0]["text"]
    assert text.startswith("what are these?")
    assert f"[attached file: {notes} (application/pdf, 14 bytes)]" in text
    assert '"film.mp4" (30 MB), which was not downloaded' in text
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(
        PNG).decode()
    assert not list(inbox.glob("*film*"))


async def test_the_agent_sends_a_workspace_file(gateway: Gateway, dc: FakeDiscord,
                                                llm: ScriptedLLM,
                                                world: dict[str, Any]) -> None:
    (gateway.config.workspace_path / "report.txt").write_text("all good\n")
    llm.tool_call("message", {"text": "Here is the report.", "files": ["report.txt"]})
    llm.reply("I sent you the report.")
    dm = dc.dm_channel(world["ada"])
    dc.post(dm, world["ada"], "send me the report")
    text, file = await dc.wait_sent(dm["id"], 2)
    assert text.content == "Here is the report."
    assert file.files == [("report.txt", b"all good\n")]
    assert await gateway.manager.flush(10)
    assert len(dc.sent_to(dm["id"])) == 2  # the final reply is not sent a second time


async def test_rate_limit_waits_and_the_answer_arrives_once(gateway: Gateway, dc: FakeDiscord,
                                                            llm: ScriptedLLM,
                                                            world: dict[str, Any]) -> None:
    llm.reply("worth the wait")
    dc.fail_next("create_message", 429, retry_after=0.5)
    dm = dc.dm_channel(world["ada"])
    dc.post(dm, world["ada"], "hello")
    loop = asyncio.get_running_loop()
    await dc.wait_for(lambda: ("POST", f"channels/{dm['id']}/messages") in dc.calls)
    refused_at = loop.time()
    [reply] = await dc.wait_sent(dm["id"])
    assert loop.time() - refused_at >= 0.45  # Discord's retry_after was honoured
    assert reply.content == "worth the wait"
    assert dc.calls.count(("POST", f"channels/{dm['id']}/messages")) == 2


async def test_server_errors_and_lost_answers_deliver_once(gateway: Gateway, dc: FakeDiscord,
                                                           llm: ScriptedLLM,
                                                           world: dict[str, Any]) -> None:
    llm.reply("exactly once")
    dc.fail_next("create_message", 503)  # the outbox retries
    dc.fail_next("create_message", drop=True, after_commit=True)  # created, answer lost
    dm = dc.dm_channel(world["ada"])
    dc.post(dm, world["ada"], "hello")
    await dc.wait_for(lambda: dc.calls.count(("POST", f"channels/{dm['id']}/messages")) >= 3)
    assert await gateway.manager.flush(10)
    assert [s.content for s in dc.sent_to(dm["id"])] == ["exactly once"]  # the nonce held
    assert gateway.health()["channels"]["discord"]["dead_letters"] == 0


async def test_a_dropped_gateway_loses_nothing(gateway: Gateway, dc: FakeDiscord,
                                               llm: ScriptedLLM, world: dict[str, Any]) -> None:
    channel = channel_of(gateway)
    dm = dc.dm_channel(world["ada"])
    llm.reply("I am still here.")
    await dc.drop_gateway()
    dc.post(dm, world["ada"], "are you there?")  # said while the bot was away
    [reply] = await dc.wait_sent(dm["id"])
    assert reply.content == "I am still here."
    assert len(dc.resumes) == 1 and dc.replayed >= 1  # the session resumed, the message replayed
    assert channel.disconnects == 1 and channel.resumes == 1
    # An answer produced while the gateway is down still goes out (REST needs no gateway).
    answer = llm.hold()
    llm.reply("Answered during the outage.")
    dc.post(dm, world["ada"], "and now?")
    await llm.wait_for_requests(2)
    dc.gateway_open = False
    await dc.drop_gateway()
    await channel.wait_until(lambda c: not c.status().running)
    assert gateway.health()["channels"]["discord"]["state"] == "down"
    answer.release()
    await dc.wait_sent(dm["id"], 2)
    dc.gateway_open = True
    await channel.wait_until(lambda c: c.status().running)
    assert gateway.health()["channels"]["discord"]["state"] == "connected"


async def test_a_fresh_session_reads_back_what_it_missed(
        gateway: Gateway, dc: FakeDiscord, llm: ScriptedLLM, world: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discord_library, "IDENTIFY_DELAY", 0.0)
    channel = channel_of(gateway)
    dm = dc.dm_channel(world["ada"])
    llm.reply("one").reply("two")
    dc.post(dm, world["ada"], "first")
    await dc.wait_sent(dm["id"])
    await dc.invalidate_session()  # RESUME refused: Discord replays nothing
    dc.post(dm, world["ada"], "second, while the bot was away")
    replies = await dc.wait_sent(dm["id"], 2)
    assert replies[1].content == "two"
    assert len(dc.identifies) == 2 and channel.catch_ups == 1
    assert user_texts(llm.last_request)[-1] == "second, while the bot was away"
    assert llm.calls == 2  # the first message was not answered again


async def test_what_was_said_while_stopped_is_answered_after_a_restart(
        make_config: MakeConfig, dc: FakeDiscord, llm: ScriptedLLM,
        world: dict[str, Any]) -> None:
    config = discord_config(make_config, dc)
    dm = dc.dm_channel(world["ada"])
    llm.reply("one")
    async with Gateway(config, grace=2.0):
        dc.post(dm, world["ada"], "first")
        await dc.wait_sent(dm["id"])
    # Discord keeps nothing for a bot that is away: only the channel history has it.
    dc.post(dm, world["ada"], "said while Parley was stopped")
    dc.post(world["general"], world["bob"], "unrelated chatter in a channel never read")
    llm.reply("caught up")
    async with Gateway(config, grace=2.0) as gw:
        replies = await dc.wait_sent(dm["id"], 2)
        assert replies[1].content == "caught up"
        assert channel_of(gw).catch_ups == 1
        assert await gw.manager.flush(10)
    assert user_texts(llm.last_request)[-1] == "said while Parley was stopped"
    assert llm.calls == 2  # "first" was not answered again
    assert [m.content for m in dc.sent_to(dm["id"])] == ["one", "caught up"]


async def test_unacknowledged_heartbeats_reconnect(make_config: MakeConfig,
                                                   world: dict[str, Any]) -> None:
    async with FakeDiscord(heartbeat_interval=0.1) as fast:
        fast.guild(GUILD_ID, "Trip planning")
        config = discord_config(make_config, fast, watchdog="0.4s")
        async with Gateway(config, grace=2.0) as gw:
            channel = channel_of(gw)
            fast.ack_heartbeats = False  # a zombie connection: open, but nothing answers
            await channel.wait_until(lambda c: c.watchdog_restarts >= 1)
            fast.ack_heartbeats = True
            await fast.wait_for(lambda: len(fast.resumes) >= 1 and fast.connected)
            await channel.wait_until(lambda c: c.status().running)


async def test_refused_message_content_intent_names_the_switch(
        make_config: MakeConfig, dc: FakeDiscord, world: dict[str, Any]) -> None:
    dc.privileged_intents = False
    async with Gateway(discord_config(make_config, dc), grace=2.0) as gw:
        health = gw.health()  # the gateway runs on; the channel is down and says why
        assert health["status"] == "degraded"
        assert health["channels"]["discord"]["state"] == "down"
        assert "MESSAGE CONTENT INTENT" in health["channels"]["discord"]["reason"]


def leftovers() -> list[str]:
    """Our tasks, discord.py's READY bookkeeping task, its heartbeat threads."""
    tasks = [repr(t) for t in asyncio.all_tasks() if not t.done() and (
        t.get_name().startswith("discord") or "ConnectionState" in repr(t.get_coro()))]
    return tasks + [t.name for t in threading.enumerate()
                    if t.name.startswith("keep-alive-handler") and not _joined(t)]


async def test_no_discord_task_survives_stop(make_config: MakeConfig, dc: FakeDiscord,
                                             llm: ScriptedLLM, world: dict[str, Any]) -> None:
    config = discord_config(make_config, dc)
    async with Gateway(config, grace=2.0):
        pass  # stopped within seconds of READY, while discord.py still waits for guilds
    assert leftovers() == []
    answer = llm.hold()
    llm.reply("hi")
    gw = Gateway(config, grace=2.0)
    await gw.start()
    dm = dc.dm_channel(world["ada"])
    dc.post(dm, world["ada"], "hello")
    await dc.wait_for(lambda: bool(dc.typing))  # typing is running
    answer.release()
    await dc.wait_sent(dm["id"])
    await gw.stop()
    assert leftovers() == []
    assert gw.health()["channels"]["discord"]["running"] is False


async def test_messages_during_a_turn_are_collected(gateway: Gateway, dc: FakeDiscord,
                                                    llm: ScriptedLLM,
                                                    world: dict[str, Any]) -> None:
    first = llm.hold()
    llm.reply("first answer").reply("second answer")
    dm = dc.dm_channel(world["ada"])
    dc.post(dm, world["ada"], "one")
    await llm.wait_for_requests(1)
    dc.post(dm, world["ada"], "two")
    dc.post(dm, world["ada"], "three")
    await queued(gateway, f"discord:{dm['id']}", 2)
    first.release()
    replies = await dc.wait_sent(dm["id"], 2)
    assert [r.content for r in replies] == ["first answer", "second answer"]
    last = user_texts(llm.last_request)[-1]
    assert "two" in last and "three" in last  # queue_mode collect: one turn for both
    assert llm.calls == 2
