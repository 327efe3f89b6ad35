"""The tool loop, with real tools and the scripted model behind the real provider."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.provider import Provider
from agent.runner import Runner, Transcript, cut_result
from agent.tools.base import ToolRegistry, tool
from agent.turn import TurnContext
from gateway.kernel.config import AgentConfig
from gateway.kernel.events import InboundMessage
from tests.fakes.openai_server import ScriptedLLM

both_started = asyncio.Event()
arrived: list[str] = []


@tool
async def wait_for_other(ctx: TurnContext, name: str) -> str:
    """Returns once both calls of this turn are running: proves they run concurrently.

    Args:
        name: Who is waiting.
    """
    arrived.append(name)
    if len(arrived) == 2:
        both_started.set()
    await asyncio.wait_for(both_started.wait(), 5)
    return f"{name} done"


@tool
async def big(ctx: TurnContext) -> str:
    """A huge result."""
    return "x" * 50_000


hang_started = asyncio.Event()


@tool
async def hang(ctx: TurnContext) -> str:
    """Never returns."""
    hang_started.set()
    await asyncio.Event().wait()
    return ""


_providers: list[Provider] = []


@pytest.fixture(autouse=True)
async def _close_providers() -> AsyncIterator[None]:
    yield
    while _providers:
        await _providers.pop().aclose()


def make(llm: ScriptedLLM, tmp_path: Path, *tools: object, iterations: int = 5) -> Runner:
    p = Provider(AgentConfig.model_validate({
        "model": "openai/test-model", "api_base": llm.base_url, "api_key": "k",
        "retry_backoff": 0.001}))
    _providers.append(p)
    return Runner(p, ToolRegistry(tools), max_iterations=iterations,  # type: ignore[arg-type]
                  max_result_chars=1000)


def ctx(tmp_path: Path) -> TurnContext:
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner",
                                              text="", received_at=datetime.now(UTC)),
                       session_id=1, workspace=tmp_path)


async def test_independent_calls_run_concurrently(llm: ScriptedLLM, tmp_path: Path) -> None:
    arrived.clear()
    both_started.clear()
    llm.tool_calls([("wait_for_other", {"name": "a"}), ("wait_for_other", {"name": "b"})])
    llm.reply("both finished")
    result = await make(llm, tmp_path, wait_for_other).run(
        messages=[{"role": "user", "content": "go"}], ctx=ctx(tmp_path))
    assert result.text == "both finished"
    tools = [m for m in result.new_messages if m["role"] == "tool"]
    assert [m["content"] for m in tools] == ["a done", "b done"]
    assert len(result.responses) == 2


async def test_long_results_are_cut_with_a_marker(llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.tool_call("big", {}).reply("ok")
    result = await make(llm, tmp_path, big).run(messages=[{"role": "user", "content": "go"}],
                                                ctx=ctx(tmp_path))
    content = result.new_messages[1]["content"]
    assert len(content) < 1200 and "characters of this tool result cut" in content


async def test_max_iterations(llm: ScriptedLLM, tmp_path: Path) -> None:
    for i in range(3):
        llm.tool_call("big", {"n": i})  # bad args each time: still a step
    result = await make(llm, tmp_path, big, iterations=3).run(
        messages=[{"role": "user", "content": "go"}], ctx=ctx(tmp_path))
    assert result.stop_reason == "max_iterations"
    assert "after 3 tool steps" in result.text
    llm.assert_all_used()


async def test_a_cancelled_run_leaves_its_complete_rounds_to_the_hooks(
        llm: ScriptedLLM, tmp_path: Path) -> None:
    hang_started.clear()
    llm.tool_call("big", {}).tool_call("hang", {})
    transcript = Transcript()
    run = asyncio.create_task(make(llm, tmp_path, big, hang).run(
        messages=[{"role": "user", "content": "go"}], ctx=ctx(tmp_path), hooks=transcript))
    await asyncio.wait_for(hang_started.wait(), 5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert len(transcript.so_far.responses) == 2  # both model calls are counted
    kept = transcript.so_far.complete_messages()  # the round without its result is not
    assert [m["role"] for m in kept] == ["assistant", "tool"]
    assert kept[0]["tool_calls"][0]["function"]["name"] == "big"


def test_cut_result_keeps_head_and_tail() -> None:
    text = "HEAD" + "-" * 10_000 + "TAIL"
    cut = cut_result(text, 1000)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and "cut" in cut
    assert cut_result("short", 1000) == "short"


async def test_history_written_once_is_sent_as_is_until_a_message_of_it_is_shortened(
        llm: ScriptedLLM, tmp_path: Path) -> None:
    """The history the turns carry as JSON (``EncodedSpan``) is copied into the request; once
    the loop shortens an old tool result inside it, the next request writes it anew."""
    from agent.fingerprint import message_json
    from agent.llm_types import EncodedSpan
    from agent.runner import TurnBudget

    history = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "big", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "name": "big", "content": "y" * 2000},
        {"role": "assistant", "content": "read"}]
    messages = [{"role": "system", "content": "s"}, *history, {"role": "user", "content": "go"}]
    span = EncodedSpan(1, len(history), b",".join(message_json(m) for m in history))

    def size(m: dict[str, object]) -> int:
        return len(str(m.get("content") or ""))

    budget = TurnBudget(limit=2500, used=sum(map(size, messages)), count=size)
    llm.tool_call("big", {}).reply("ok")
    result = await make(llm, tmp_path, big).run(messages=messages, ctx=ctx(tmp_path),
                                               budget=budget, encoded=span)
    assert result.text == "ok" and result.shortened == 1
    first, second = (r["messages"] for r in llm.requests)
    assert first == messages
    assert second[3]["content"].startswith("[shortened") and second[:3] == messages[:3]
