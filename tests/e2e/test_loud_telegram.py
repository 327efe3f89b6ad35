"""Channels that fail loudly, on Telegram: the whole gateway against a fake Bot API that goes
away, refuses an optional call, or answers ``ok`` with something python-telegram-bot cannot
read. Health comes from what completed; nothing ends the gateway; nothing arrives twice."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from channels.telegram import TelegramChannel
from gateway.app import Gateway
from gateway.kernel.config import Config
from gateway.kernel.events import OutboundMessage
from tests.channels.test_telegram import free_port
from tests.conftest import MakeConfig
from tests.e2e.test_cli import PARLEY, _env, parley, write_config
from tests.e2e.test_gateway import Client
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.telegram_server import FakeTelegram

ADA_ID = 1001
WATCHDOG = 2.0


class Clock:
    """Monotonic seconds for the channel's watchdog and health; they move only when the test
    says, so a slow machine never makes a sample degraded."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def config(make_config: MakeConfig, tg: FakeTelegram, *, local: bool = False) -> Config:
    section = {"enabled": True, "token": tg.token, "base_url": tg.base_url,
               "base_file_url": tg.base_file_url, "poll_timeout": "0.2s",
               "watchdog": f"{WATCHDOG:g}s", "allow_from": [str(ADA_ID)]}
    return make_config(channels={"local": {"enabled": local, "port": 0}, "telegram": section,
                                 "delivery": {"backoff": "0.05s"}})


def telegram(gw: Gateway) -> TelegramChannel:
    channel = gw.manager.channels["telegram"]
    assert isinstance(channel, TelegramChannel)
    return channel


def failed_polls(tg: FakeTelegram) -> int:
    return tg.gone_calls.get("getUpdates", 0) + tg.gone_calls.get("getMe", 0)


async def test_health_is_degraded_within_the_watchdog_while_the_api_is_gone(
        make_config: MakeConfig, tg: FakeTelegram) -> None:
    clock = Clock()
    async with Gateway(config(make_config, tg), grace=2.0, monotonic=clock) as gw:
        channel = telegram(gw)
        await channel.wait_until(lambda c: c.last_poll_ok is not None)
        assert gw.health()["status"] == "ok"
        await tg.set_gone(True)
        last_ok = clock.now  # the clock stood still: the last completed poll was now
        step = 0.5  # a poll interval, in the channel's time
        samples: list[tuple[float, str, str]] = []
        for n in range(1, 13):  # one sample after each failed poll, the clock moved a step
            await tg.wait_for(lambda n=n: failed_polls(tg) >= n)
            clock.now += step
            health = gw.health()
            state = health["channels"]["telegram"]["state"]
            samples.append((clock.now - last_ok, state, health["status"]))
            if clock.now - last_ok > WATCHDOG:
                assert state == "degraded" and health["status"] == "degraded", samples
                assert "no getUpdates completed for" in health["channels"]["telegram"]["reason"]
            else:
                assert state == "connected" and health["status"] == "ok", samples
        assert [s for s in samples if s[1] == "degraded"][0][0] <= WATCHDOG + step
        await channel.wait_until(lambda c: c.watchdog_restarts >= 1)  # polling rebuilt...
        assert gw.health()["channels"]["telegram"]["state"] == "degraded"  # ...still degraded
        seen = channel.last_poll_ok
        await tg.set_gone(False)
        await channel.wait_until(lambda c: c.last_poll_ok != seen)
        health = gw.health()
        assert health["channels"]["telegram"]["state"] == "connected"
        assert health["status"] == "ok" and health["channels"]["telegram"]["reason"] is None


async def test_a_refused_command_menu_does_not_stop_answering(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="channels")
    tg.fail_next("setMyCommands", 500, times=1000)
    llm.reply("answered all the same")
    async with Gateway(config(make_config, tg), grace=2.0) as gw:
        tg.dm(tg.user(ADA_ID, "Ada"), "hello?")
        [reply] = await tg.wait_sent(ADA_ID)
        assert reply.text == "answered all the same"
        assert gw.health()["channels"]["telegram"]["state"] == "connected"
    assert "setMyCommands failed" in caplog.text
    assert "getUpdates failed" not in caplog.text and tg.commands is None


async def test_a_malformed_get_me_leaves_the_gateway_up_and_the_channel_down(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    tg.malform_next("getMe", "first_name")  # PTB's User cannot be built without it
    llm.reply("local still answers")
    llm.reply("and telegram too, once it started")
    async with Gateway(config(make_config, tg, local=True), grace=2.0) as gw:
        health = gw.health()
        assert gw.state == "running" and health["status"] == "degraded"
        down = health["channels"]["telegram"]
        assert down["state"] == "down" and not down["running"]
        assert "malformed getMe answer" in down["reason"] and "\n" not in down["reason"]
        async with aiohttp.ClientSession() as session:
            local = Client(session, gw.local.base_url)
            reply = await local.ask("c1", "are you there?")
            assert reply["text"] == "local still answers"
            async with session.get(f"{gw.local.base_url}/v1/health") as resp:
                body: dict[str, Any] = await resp.json()
            assert body["channels"]["telegram"]["state"] in ("down", "connected")
        # The gateway starts the channel again (with backoff), and then it answers.
        await telegram(gw).wait_until(lambda c: c.status().state == "connected")
        tg.dm(tg.user(ADA_ID, "Ada"), "and here?")
        [reply_tg] = await tg.wait_sent(ADA_ID)
        assert reply_tg.text == "and telegram too, once it started"
        assert gw.manager.down == {}


async def test_a_send_with_a_malformed_answer_arrives_once(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    llm.reply("exactly once")
    tg.malform_next("sendMessage", "message_id")  # stored by the fake, answer unreadable
    async with Gateway(config(make_config, tg), grace=2.0) as gw:
        tg.dm(tg.user(ADA_ID, "Ada"), "hi")
        await tg.wait_sent(ADA_ID)
        assert await gw.manager.flush(10)
        assert [s.text for s in tg.sent_to(ADA_ID)] == ["exactly once"]
        assert [m for m, _ in tg.calls].count("sendMessage") == 1
        health = gw.health()["channels"]["telegram"]
        assert health["sent"] == 1 and health["dead_letters"] == 0


async def test_a_send_whose_answer_never_comes_is_resent_once_at_most(
        make_config: MakeConfig, tg: FakeTelegram) -> None:
    async with Gateway(config(make_config, tg), grace=2.0) as gw:
        tg.private(tg.user(ADA_ID, "Ada"))
        tg.fail_next("sendMessage", drop=True, times=2)  # the connection closes, unanswered
        out = OutboundMessage(channel="telegram", chat_id=str(ADA_ID), text="maybe")
        await gw.bus.publish_outbound(out)
        assert await gw.manager.flush(10)
        assert [m for m, _ in tg.calls].count("sendMessage") == 2  # the first try, one resend
        assert gw.store is not None
        row = await gw.store.fetchone("SELECT status, last_error FROM outbox WHERE "
                                      "idempotency_key = ?", (out.idempotency_key,))
        assert row[0] == "dead" and "outcome unknown twice" in row[1]


async def test_the_gateway_process_runs_on_and_status_says_why(
        tmp_path: Path, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    tg.malform_next("getMe", "first_name", times=10_000)  # never readable
    config = write_config(tmp_path, llm)
    data = yaml.safe_load(config.read_text())
    port = free_port()
    data["channels"] = {"local": {"port": port}, "telegram": {
        "enabled": True, "token": tg.token, "base_url": tg.base_url,
        "base_file_url": tg.base_file_url, "poll_timeout": "0.2s", "watchdog": "2s"}}
    config.write_text(yaml.safe_dump(data))
    proc = await asyncio.create_subprocess_exec(
        PARLEY, "gateway", "--config", str(config), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=_env())
    assert proc.stderr is not None
    try:
        log: list[str] = []
        while not any("gateway running" in line for line in log):
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "gateway exited early:\n" + "".join(log)
            log.append(line)
        code, out, err = await parley("status", "--config", str(config))
        assert code == 0, err
        assert "health:   degraded" in out
        row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("telegram"))
        assert "down (the Bot API at" in row and "malformed getMe answer" in row
        proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0
        stderr = "".join(log) + rest.decode()
        assert "Traceback" not in stderr and "could not start" in stderr
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
