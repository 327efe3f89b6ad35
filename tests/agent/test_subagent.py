"""SubagentManager with the real Runner and Provider, talking to the scripted model."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from agent.provider import Provider
from agent.subagent import RESULT_TAG, SubagentManager, subagent_registry
from agent.tools import build_registry
from agent.tools.base import Tool, ToolRegistry
from agent.turn import TurnContext, TurnServices
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store
from tests.agent.tools.conftest import EXEC_FOR_LISTS
from tests.conftest import MakeConfig, offered_tools
from tests.fakes.openai_server import ScriptedLLM


def registry(config: Config) -> ToolRegistry:
    return build_registry(config.agent.tools, exec_access=EXEC_FOR_LISTS)


def parent_ctx(config: Config, session_id: int = 1) -> TurnContext:
    msg = InboundMessage(session_override="local:c1", channel="local", chat_id="c1",
                         sender_id="u1", trust="owner", text="", thread_id="t7",
                         received_at=datetime(2026, 3, 2, 9, 30, tzinfo=UTC))
    return TurnContext(message=msg, session_id=session_id, workspace=config.workspace_path,
                       tools=config.agent.tools)


class Env:
    def __init__(self, config: Config, store: Store, bus: MessageBus) -> None:
        self.config = config
        self.store = store
        self.bus = bus
        self.provider = Provider(config.agent)
        self.reg = registry(config)
        self.manager = SubagentManager(config=config, provider=self.provider,
                                       registry=self.reg, bus=bus, store=store)


@pytest.fixture
async def env(make_config: MakeConfig, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    spawn: dict[str, Any] = getattr(request, "param", {})
    config = make_config(agent={"tools": {"spawn": spawn}})
    config.workspace_path.mkdir(parents=True, exist_ok=True)
    store = await Store.open(config.db_path)
    bus = MessageBus()
    bus.attach_store(store, config.channels.delivery.ttl)
    e = Env(config, store, bus)
    try:
        yield e
    finally:
        await e.manager.stop()
        await e.provider.aclose()
        await store.close()


def tool_names(request: dict[str, Any]) -> set[str]:
    return offered_tools(request)


def test_a_subagent_gets_no_message_cron_or_spawn_tools(make_config: MakeConfig) -> None:
    config = make_config()
    names = subagent_registry(registry(config)).names
    assert {"message", "cron", "spawn"} <= set(registry(config).names)
    assert not {"message", "cron", "spawn"} & set(names)
    assert {"read_file", "exec", "web_fetch"} <= set(names)


async def test_foreground_round_trip_in_its_own_session(env: Env, llm: ScriptedLLM) -> None:
    llm.tool_call("list_dir", {"path": "."}).reply("The workspace holds 3 files.")
    result = await env.manager.spawn(parent_ctx(env.config), "Count the workspace files.",
                                     background=False)
    assert result.startswith("[subagent ") and ": done]" in result
    assert result.endswith("The workspace holds 3 files.")
    llm.assert_all_used()

    first = llm.requests[0]
    system, user = first["messages"]
    assert system["role"] == "system" and system["content"].startswith("# Subagent")
    assert "2026-03-02 09:30 UTC (Monday)" in system["content"]
    assert user == {"role": "user", "content": "Count the workspace files."}
    assert "spawn" not in tool_names(first) and "list_dir" in tool_names(first)
    assert env.manager.running == 0

    sessions = [s.key for s in await env.store.list_sessions()]
    sub = [k for k in sessions if k.startswith("subagent:local:c1:")]
    assert len(sub) == 1
    session = await env.store.find_session(sub[0])
    assert session is not None
    stored = [m.body async for m in env.store.all_messages(session.id)]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert (await env.store.usage(session.id))[0] == 2  # its model calls are counted


async def test_background_result_comes_back_as_a_system_message(env: Env,
                                                                 llm: ScriptedLLM) -> None:
    llm.reply("Background answer.")
    text = await env.manager.spawn(parent_ctx(env.config), "Look it up.", background=True)
    assert "started in the background" in text
    msg = await asyncio.wait_for(env.bus.consume_inbound(), 60)
    assert msg.kind == "subagent"
    assert (msg.channel, msg.chat_id, msg.thread_id) == ("local", "c1", "t7")
    assert msg.session_key == "local:c1"  # the parent's session, from the turn context
    assert msg.deliver_to == ("local", "c1")
    assert msg.text.startswith(RESULT_TAG)
    assert "Task: Look it up." in msg.text and msg.text.endswith("Background answer.")
    assert await env.store.inbox_pending(["local"]) == [msg]  # durable until answered


@pytest.mark.parametrize("env", [{"max_concurrent": 1}], indirect=True)
async def test_concurrency_is_limited(env: Env, llm: ScriptedLLM) -> None:
    release = asyncio.Event()

    async def held(body: dict[str, Any]) -> str:
        await release.wait()
        return "finally done"

    llm.respond_with(held)
    await env.manager.spawn(parent_ctx(env.config), "long task", background=True)
    with pytest.raises(Exception, match="1 subagents are already running"):
        await env.manager.spawn(parent_ctx(env.config), "another", background=False)
    release.set()
    msg = await asyncio.wait_for(env.bus.consume_inbound(), 60)
    assert msg.text.endswith("finally done")
    assert env.manager.running == 0


@pytest.mark.parametrize("env", [{"timeout": "0.3s"}], indirect=True)
async def test_timeout(env: Env, llm: ScriptedLLM) -> None:
    never = asyncio.Event()

    async def hang(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    llm.respond_with(hang)
    result = await env.manager.spawn(parent_ctx(env.config), "hang", background=False)
    assert ": timeout]" in result and "stopped after 0.3s" in result


@pytest.mark.parametrize("env", [{"max_iterations": 2}], indirect=True)
async def test_iterations_are_limited(env: Env, llm: ScriptedLLM) -> None:
    llm.tool_call("list_dir", {"path": "."}).tool_call("read_file", {"path": "x"})
    result = await env.manager.spawn(parent_ctx(env.config), "loop", background=False)
    assert ": max_iterations]" in result
    llm.assert_all_used()


async def test_stop_cancels_background_subagents(env: Env, llm: ScriptedLLM) -> None:
    started = asyncio.Event()

    async def hang(body: dict[str, Any]) -> str:
        started.set()
        await asyncio.Event().wait()
        return ""

    llm.respond_with(hang)
    await env.manager.spawn(parent_ctx(env.config), "hang", background=True)
    await asyncio.wait_for(started.wait(), 60)
    await env.manager.stop()
    assert env.manager.running == 0
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("subagent:")]
    assert env.bus.inbound_size == 0


async def test_the_spawn_tool_needs_the_service(make_config: MakeConfig) -> None:
    config = make_config()
    reg = build_registry(config.agent.tools)
    spawn = reg.get("spawn")
    assert isinstance(spawn, Tool)
    out = await reg.execute("spawn", {"task": "x"}, parent_ctx(config))
    assert out.is_error and "not available" in out.text

    calls: list[tuple[str, bool]] = []

    async def spawner(ctx: TurnContext, task: str, *, background: bool) -> str:
        calls.append((task, background))
        return "sub says hi"

    ctx = dataclasses.replace(parent_ctx(config), services=TurnServices(spawn=spawner))
    out = await reg.execute("spawn", {"task": "do it", "background": True}, ctx)
    assert out.text == "sub says hi" and calls == [("do it", True)]


async def test_background_results_follow_a_system_turns_target(env: Env,
                                                                llm: ScriptedLLM) -> None:
    llm.reply("Report ready.")
    parent = parent_ctx(env.config)
    cron_ctx = dataclasses.replace(parent, message=dataclasses.replace(
        parent.message, channel="cron", chat_id="job1", session_override="cron:job1",
        kind="cron", deliver_to=("telegram", "42")))
    await env.manager.spawn(cron_ctx, "Write the report.", background=True)
    msg = await asyncio.wait_for(env.bus.consume_inbound(), 60)
    assert msg.deliver_to == ("telegram", "42") and msg.session_key == "cron:job1"

    heartbeat = dataclasses.replace(cron_ctx, message=dataclasses.replace(
        cron_ctx.message, kind="heartbeat", deliver_to=None))
    with pytest.raises(Exception, match="no chat to report back to"):
        await env.manager.spawn(heartbeat, "anything", background=True)
