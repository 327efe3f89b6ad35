"""Channels that fail loudly, on Discord: the whole gateway against a fake Discord that goes
deaf with its heartbeats still acknowledged, or answers 200 with something discord.py cannot
read. Health comes from what completed; nothing ends the gateway; nothing arrives twice."""

from __future__ import annotations

from typing import Any

from gateway.app import Gateway
from gateway.kernel.events import OutboundMessage
from tests.conftest import MakeConfig
from tests.e2e.test_discord import channel_of, discord_config
from tests.e2e.test_discord import world as world  # noqa: F401 (fixture)
from tests.e2e.test_loud_telegram import Clock
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import ScriptedLLM

WATCHDOG = 2.0


async def test_a_malformed_login_answer_leaves_the_gateway_up_and_the_channel_down(
        make_config: MakeConfig, dc: FakeDiscord, llm: ScriptedLLM,
        world: dict[str, Any]) -> None:
    dc.malform_next("login", "username")  # discord.py's ClientUser cannot be built without it
    llm.reply("here after all")
    async with Gateway(discord_config(make_config, dc), grace=2.0) as gw:
        health = gw.health()
        assert gw.state == "running" and health["status"] == "degraded"
        down = health["channels"]["discord"]
        assert down["state"] == "down" and "malformed login answer" in down["reason"]
        assert "\n" not in down["reason"]
        channel = channel_of(gw)
        await channel.wait_until(lambda c: c.status().state == "connected")  # started again
        dm = dc.dm_channel(world["ada"])
        dc.post(dm, world["ada"], "hello?")
        [reply] = await dc.wait_sent(dm["id"])
        assert reply.content == "here after all" and gw.health()["status"] == "ok"


async def test_a_send_with_a_malformed_answer_arrives_once(
        make_config: MakeConfig, dc: FakeDiscord, llm: ScriptedLLM,
        world: dict[str, Any]) -> None:
    llm.reply("exactly once")
    dc.malform_next("create_message", "id")  # created by the fake, the answer unreadable
    async with Gateway(discord_config(make_config, dc), grace=2.0) as gw:
        dm = dc.dm_channel(world["ada"])
        dc.post(dm, world["ada"], "hi")
        await dc.wait_sent(dm["id"])
        assert await gw.manager.flush(10)
        assert [s.content for s in dc.sent_to(dm["id"])] == ["exactly once"]  # the nonce held
        health = gw.health()["channels"]["discord"]
        assert health["sent"] == 1 and health["dead_letters"] == 0


async def test_a_deaf_gateway_is_degraded_and_reconnected(
        make_config: MakeConfig, dc: FakeDiscord, world: dict[str, Any]) -> None:
    clock = Clock()
    config = discord_config(make_config, dc, watchdog=f"{WATCHDOG:g}s")
    async with Gateway(config, grace=2.0, monotonic=clock) as gw:
        channel = channel_of(gw)
        dm = dc.dm_channel(world["ada"])
        out = OutboundMessage(channel="discord", chat_id=dm["id"], text="echo?")
        assert (await channel.send(out)).ok
        await channel.wait_until(lambda c: int(dc.sent[-1].message_id) in c._echoed)
        clock.now += WATCHDOG + 1  # echoed: a quiet server is not a deaf one
        assert gw.health()["channels"]["discord"]["state"] == "connected"
        dc.deaf = True  # heartbeats still acknowledged, nothing dispatched
        heartbeats = dc.heartbeats
        second = OutboundMessage(channel="discord", chat_id=dm["id"], text="anyone?")
        assert (await channel.send(second)).ok
        assert gw.health()["channels"]["discord"]["state"] == "connected"  # not yet due
        clock.now += WATCHDOG + 0.5
        health = gw.health()
        assert health["status"] == "degraded", health
        discord = health["channels"]["discord"]
        assert discord["state"] == "degraded" and "after a send" in discord["reason"]
        await dc.wait_for(lambda: dc.heartbeats > heartbeats)  # the heartbeat goes on
        await channel.wait_until(lambda c: c.watchdog_restarts >= 1)
        await dc.wait_for(lambda: len(dc.resumes) >= 1)  # a new connection, not deaf
        await channel.wait_until(lambda c: c.status().state == "connected")
        assert gw.health()["status"] == "ok"
