"""Nothing lost: inbox, outbox, restarts, crashes, failing and stalled channels, load.

The gateway runs whole, with the scripted model behind litellm; ``ScriptedChannel`` stands in
for a chat platform whose sends fail, stall or rate-limit on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from channels.base import ChannelBase, ChannelStatus
from gateway.app import Gateway
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.values import ChannelHints, Delivery
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM

PARLEY = str(Path(sys.executable).parent / "parley")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str | None:
    """Every test here runs on both stores: SQLite (no ``database``), and PostgreSQL (a fresh
    database on the session's throwaway cluster)."""
    return str(request.getfixturevalue("postgres_url")) if request.param == "postgresql" \
        else None


@pytest.fixture
def make_config(make_config: MakeConfig, database: str | None) -> MakeConfig:
    if database is None:
        return make_config
    return lambda **overrides: make_config(**{"database": database, **overrides})


class ScriptedChannel(ChannelBase):
    """A chat platform on a leash: ``results`` are returned by ``send`` in order (then ok);
    ``gate`` makes every send wait until it is set."""

    hints = ChannelHints()

    def __init__(self, name: str = "platform") -> None:
        self.name = name
        self.results: list[Delivery] = []
        self.sent: list[OutboundMessage] = []
        self.tries = 0
        self.gate: asyncio.Event | None = None
        self.tried = asyncio.Event()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=True)

    async def send(self, msg: OutboundMessage) -> Delivery:
        self.tries += 1
        self.tried.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.results:
            return self.results.pop(0)
        self.sent.append(msg)
        return Delivery(ok=True, message_ids=(str(len(self.sent)),))

    async def wait_sent(self, n: int, timeout: float = 10) -> None:
        async def until() -> None:
            while len(self.sent) < n:
                self.tried.clear()
                await self.tried.wait()
        await asyncio.wait_for(until(), timeout)


def inbound(text: str, chat: str = "c1", mid: str | None = None,
            channel: str = "platform") -> InboundMessage:
    extra = {"message_id": mid} if mid else {}
    return InboundMessage(channel=channel, chat_id=chat, sender_id="u1", text=text,
                          **{"trust": "owner", **extra})


async def test_a_repeated_channel_message_is_answered_once(gateway: Gateway,
                                                           llm: ScriptedLLM) -> None:
    llm.reply("once")
    async with aiohttp.ClientSession() as http:
        body = {"chat_id": "c1", "sender_id": "u1", "text": "hi", "message_id": "m-1"}
        for expected in (None, True):
            async with http.post(f"{gateway.local.base_url}/v1/messages", json=body) as resp:
                assert resp.status == 202
                assert (await resp.json()).get("duplicate") is expected
    found, _ = await gateway.local.wait_messages("c1", timeout=10)
    assert [r["text"] for r in found] == ["once"]
    assert llm.calls == 1


async def test_a_turn_cut_by_shutdown_is_answered_after_restart(make_config: MakeConfig,
                                                               llm: ScriptedLLM) -> None:
    config = make_config()
    llm.hold()  # never released: the turn is still waiting for the model at the stop
    llm.reply("too slow")
    gw = Gateway(config, grace=0.1)
    await gw.start()
    await gw.local.inject("c1", "important question")
    await llm.wait_for_requests(1)
    await gw.stop()  # the turn is cancelled after the grace period

    llm.reply("the answer")
    async with Gateway(config) as gw2:
        found, _ = await gw2.local.wait_messages("c1", timeout=10)
        assert [r["text"] for r in found] == ["the answer"]
        assert gw2.store is not None
        assert await gw2.store.inbox_pending() == []
        session = await gw2.store.active_session("local:c1")
        assert session.message_count == 2  # the question once, the answer once
    assert llm.last_request["messages"][-1]["content"] == "important question"


async def test_recovery_takes_only_the_channels_this_process_runs(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """``parley chat`` (terminal only) must leave the gateway's pending work alone."""
    config = make_config()
    llm.hold()  # never released: the turn is still waiting for the model at the stop
    llm.reply("too slow")
    async with Gateway(config, grace=0.1) as gw:
        await gw.local.inject("c1", "for the gateway")
        await llm.wait_for_requests(1)
    terminal_only = Gateway(config, configured_channels=False, channels=[ScriptedChannel()])
    async with terminal_only:
        assert terminal_only.store is not None
        assert len(await terminal_only.store.inbox_pending()) == 1  # still waiting
    assert llm.calls == 1
    llm.reply("answered by the gateway")
    async with Gateway(config) as gw2:
        found, _ = await gw2.local.wait_messages("c1", timeout=10)
        assert [r["text"] for r in found] == ["answered by the gateway"]


async def test_send_failures_are_retried_and_a_429_waits(make_config: MakeConfig,
                                                        llm: ScriptedLLM) -> None:
    platform = ScriptedChannel()
    platform.results = [Delivery(ok=False, error="HTTP 500"),
                        Delivery(ok=False, error="429", retry_after=0.05)]
    llm.reply("delivered in the end")
    config = make_config(channels={"delivery": {"backoff": "0.01s"}})
    async with Gateway(config, channels=[platform]) as gw:
        await gw.bus.publish_inbound(inbound("hi"))
        await platform.wait_sent(1)
        assert await gw.manager.flush(10)
        assert [m.text for m in platform.sent] == ["delivered in the end"]
        assert platform.tries == 3
        health = gw.health()["channels"]["platform"]
        assert health["sent"] == 1 and len(health["recent_errors"]) == 2
        assert gw.store is not None
        assert (await gw.store.outbox_counts()) == {"pending": 0, "dead": 0}


async def test_undelivered_replies_are_resent_after_restart_and_delivered_ones_never(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(channels={"delivery": {"backoff": "0.01s"}})
    first = ScriptedChannel()
    llm.reply("delivered").reply("stuck")
    async with Gateway(config, channels=[first], grace=0.5) as gw:
        await gw.bus.publish_inbound(inbound("one", chat="a"))
        await first.wait_sent(1)
        first.gate = asyncio.Event()  # the platform hangs from now on
        await gw.bus.publish_inbound(inbound("two", chat="b"))
        await llm.wait_for_requests(2)
        async def until_tried() -> None:
            while first.tries < 2:
                first.tried.clear()
                await first.tried.wait()
        await asyncio.wait_for(until_tried(), 10)
    # stop() waited for the hung send, gave up, and left "stuck" in the outbox
    second = ScriptedChannel()
    async with Gateway(config, channels=[second]) as gw2:
        await second.wait_sent(1)
        assert await gw2.manager.flush(10)
        assert [(m.chat_id, m.text) for m in second.sent] == [("b", "stuck")]
        assert gw2.store is not None
        assert (await gw2.store.outbox_counts())["pending"] == 0
    assert llm.calls == 2  # resending never asks the model again


async def test_expired_replies_become_dead_letters(make_config: MakeConfig,
                                                   llm: ScriptedLLM) -> None:
    platform = ScriptedChannel()
    platform.results = [Delivery(ok=False, error="HTTP 502")] * 50
    llm.reply("never arrives")
    config = make_config(channels={"delivery": {"reply_ttl": "0.3s", "backoff": "0.05s"}})
    async with Gateway(config, channels=[platform]) as gw:
        await gw.bus.publish_inbound(inbound("hi"))
        await asyncio.wait_for(platform.tried.wait(), 10)
        assert await gw.manager.flush(10)
        assert gw.store is not None
        dead = await gw.store.dead_letters()
        assert [(d["chat_id"], d["last_error"]) for d in dead] == [("c1", "HTTP 502")]
        assert gw.health()["dead_letters"] == 1
    assert platform.sent == []


async def test_permanent_failure_is_dead_at_once(make_config: MakeConfig,
                                                 llm: ScriptedLLM) -> None:
    platform = ScriptedChannel()
    platform.results = [Delivery(ok=False, error="bot was blocked by the user", permanent=True)]
    llm.reply("blocked")
    async with Gateway(make_config(), channels=[platform]) as gw:
        await gw.bus.publish_inbound(inbound("hi"))
        await asyncio.wait_for(platform.tried.wait(), 10)
        assert await gw.manager.flush(10)
        assert platform.tries == 1
        assert gw.health()["dead_letters"] == 1


async def test_a_stalled_channel_does_not_delay_another(make_config: MakeConfig,
                                                        llm: ScriptedLLM) -> None:
    stalled = ScriptedChannel("stalled")
    stalled.gate = asyncio.Event()
    llm.echo()
    async with Gateway(make_config(), channels=[stalled]) as gw:
        await gw.bus.publish_inbound(inbound("to the stalled one", channel="stalled"))
        await asyncio.wait_for(stalled.tried.wait(), 10)
        assert await gw.local.ask("c1", "are you there?", timeout=10) == "echo: are you there?"
        stalled.gate.set()
        await stalled.wait_sent(1)


async def test_many_chats_every_message_answered_once_in_order(make_config: MakeConfig,
                                                               llm: ScriptedLLM) -> None:
    chats, per_chat = 100, 20
    llm.echo()
    platform = ScriptedChannel()
    config = make_config(agent={"queue_mode": "followup", "max_concurrent_turns": 16})
    async with Gateway(config, channels=[platform]) as gw:
        await asyncio.gather(*(
            gw.bus.publish_inbound(inbound(f"{c}:{i}", chat=f"chat{c}", mid=f"{c}-{i}"))
            for i in range(per_chat) for c in range(chats)))
        await platform.wait_sent(chats * per_chat, timeout=120)
    by_chat: dict[str, list[str]] = defaultdict(list)
    for msg in platform.sent:
        by_chat[msg.chat_id].append(msg.text)
    assert len(by_chat) == chats
    for c in range(chats):
        assert by_chat[f"chat{c}"] == [f"echo: {c}:{i}" for i in range(per_chat)]
    assert llm.calls == chats * per_chat


def _write_config(tmp_path: Path, llm: ScriptedLLM, database: str | None = None) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "workspace": "ws", "data_dir": "data",
        "agent": {"model": "openai/test-model", "api_base": llm.base_url, "api_key": "k"},
        "channels": {"local": {"port": 0}}, **({"database": database} if database else {})}))
    return path


async def _start_gateway(config: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    proc = await asyncio.create_subprocess_exec(
        PARLEY, "gateway", "--config", str(config), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, "gateway exited early"
        if m := re.search(r"listening on (http://\S+)", line):
            return proc, m.group(1)


async def _drain_stderr(proc: asyncio.subprocess.Process, log: Path | None = None) -> None:
    """Read the process's log to its end (into ``log`` when given: what a failure shows)."""
    assert proc.stderr is not None
    with open(log, "ab") if log is not None else contextlib.nullcontext() as out:
        while line := await proc.stderr.readline():
            if out is not None:
                out.write(line)
                out.flush()


@pytest.mark.timeout(90)
async def test_kill_9_mid_turn_loses_nothing_and_repeats_nothing(
        tmp_path: Path, llm: ScriptedLLM, database: str | None) -> None:
    config = _write_config(tmp_path, llm, database)
    llm.reply("first answer")
    proc, base = await _start_gateway(config)
    drain = asyncio.create_task(_drain_stderr(proc))
    async with aiohttp.ClientSession() as http:
        async def post(url: str, text: str, mid: str) -> None:
            body = {"chat_id": "c1", "sender_id": "u1", "text": text, "message_id": mid}
            async with http.post(f"{url}/v1/messages", json=body) as resp:
                assert resp.status == 202

        after = 0

        async def replies(url: str) -> list[dict[str, Any]]:
            """What came after the last read: ``next`` passed back as ``after``, as the
            README says (``seq`` goes on across restarts)."""
            nonlocal after
            async with http.get(f"{url}/v1/messages", params={
                    "chat_id": "c1", "wait": "20", "after": str(after)}) as resp:
                data = await resp.json()
            after = data["next"]
            return list(data["messages"])

        await post(base, "first", "m1")
        assert [r["text"] for r in await replies(base)] == ["first answer"]
        llm.hold()  # never released: the gateway is killed mid-turn
        llm.reply("never sent")
        await post(base, "second", "m2")
        await llm.wait_for_requests(2)
        proc.send_signal(signal.SIGKILL)  # mid-turn
        await proc.wait()
        await drain

        llm.reply("second answer")
        proc2, base2 = await _start_gateway(config)
        drain2 = asyncio.create_task(_drain_stderr(proc2))
        try:
            got = await replies(base2)
            assert [r["text"] for r in got] == ["second answer"]  # "first answer" not repeated
            await post(base2, "second", "m2")  # the platform redelivers: answered once only
            llm.echo()
            await post(base2, "third", "m3")  # a later message: its answer comes next
            async with http.get(f"{base2}/v1/messages",
                                params={"chat_id": "c1", "after": str(got[-1]["seq"]),
                                        "wait": "20"}) as resp:
                assert [m["text"] for m in (await resp.json())["messages"]] == ["echo: third"]
        finally:
            proc2.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc2.wait(), 20)
            await drain2
    assert proc2.returncode == 0
    assert llm.calls == 4  # first, second (killed), second again, third
    contents = [m["content"] for m in llm.requests[2]["messages"] if m["role"] == "user"]
    assert contents[0] == "first" and contents[-1] == "second"
