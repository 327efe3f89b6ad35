"""The seed points of issue 21: the runtime block's queue and last-status lines, a
classified context_build_error, BOOTSTRAP.md and extra bootstrap files, skill folders with
precedence and ``requires`` on config keys and the OS."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from agent.context import RUNTIME_TAG
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.waiting import queued
from tests.fakes.openai_server import ScriptedLLM


def runtime_of(request: dict[str, Any]) -> str:
    block = request["messages"][-2]["content"]
    assert block.startswith(RUNTIME_TAG)
    return str(block)


async def test_the_runtime_block_says_what_waits_and_how_the_last_turn_ended(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(agent={"max_retries": 0, "queue_mode": "followup"})
    async with Gateway(config) as gw:
        llm.error(500, "the server fell over")
        await gw.local.ask("c1", "one", timeout=10)
        assert "Last turn" not in runtime_of(llm.last_request)  # the first turn has none
        gate = llm.hold()
        llm.reply("two done", gate=gate).reply("three done").reply("four done")
        await gw.local.inject("c1", "two")
        await llm.wait_for_requests(2)
        two = llm.last_request
        assert "Last turn: error (" in runtime_of(two)
        assert "Queued behind" not in runtime_of(two)
        await gw.local.inject("c1", "three")
        await gw.local.inject("c1", "four")
        await queued(gw, "local:c1", 2)
        gate.release()
        await llm.wait_for_requests(4)
        three, four = llm.requests[2], llm.requests[3]
        assert "Queued behind this turn: 1 message(s) from this chat" in runtime_of(three)
        assert "Last turn: done" in runtime_of(three)
        assert "Queued behind" not in runtime_of(four)


async def test_a_context_that_cannot_be_built_is_told_and_recorded(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config()
    async with Gateway(config) as gw:
        soul = config.workspace_path / "SOUL.md"
        soul.unlink()
        soul.symlink_to(soul)  # a loop: reading it fails (ELOOP)
        answer = await gw.local.ask("c1", "hello", timeout=10)
        assert answer.startswith("I couldn't prepare this conversation's context "
                                 "(context_build_error: OSError")
        assert llm.calls == 0
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        status, error = await gw.store.last_turn(session.id) or ("", "")
        assert status == "context_build_error"
        assert error and error.startswith("context_build_error: OSError")
        messages = [m async for m in gw.store.all_messages(session.id)]
        assert [m.body["content"] for m in messages] == ["hello"]  # nothing lost
        soul.unlink()
        soul.write_text("# Soul\nCalm.")
        llm.reply("hi")
        assert await gw.local.ask("c1", "hello again", timeout=10) == "hi"
        assert "Last turn: context_build_error (context_build_error: OSError" in \
            runtime_of(llm.last_request)
