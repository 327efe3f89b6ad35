"""Budgets that scale with the window, and compaction that follows tokens (issue 21).

Through the whole gateway and the scripted model server: a 6,000-token window (an 8k local
model) still carries the last turns word for word, and a 128k model compacts rarely.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from agent.budget import TokenCounter, reply_reserve
from gateway.app import Gateway
from gateway.kernel.config import ConfigError
from tests.conftest import MakeConfig
from tests.e2e.test_cli import parley, write_config
from tests.e2e.test_context_engine import is_flush_call, is_summary_call
from tests.fakes.openai_server import ScriptedLLM

WORDS = ("apple river stone cloud lamp garden violin paper window harbour candle forest "
         "engine marble pepper silver tunnel orange ladder meadow").split()


def question(i: int) -> str:
    return f"question {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(20))


def answer(i: int) -> str:
    return f"reply {i}: " + " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(30))


def tool_model(llm: ScriptedLLM, events: list[tuple[str, int]] | None = None
               ) -> dict[str, int]:
    """Each turn: a read_file call, then a reply naming the turn; summaries and flushes
    answered too (and noted in ``events`` with the turn they came in). Returns the counts
    of each kind of call."""
    counts = {"summary": 0, "flush": 0, "turn": 0}
    calls = itertools.count(1)
    events = [] if events is None else events

    def respond(body: dict[str, Any]) -> Any:
        if is_summary_call(body):
            counts["summary"] += 1
            events.append(("summary", counts["turn"]))
            return f"SUMMARY {counts['summary']}: the user asked numbered questions."
        if is_flush_call(body):
            counts["flush"] += 1
            events.append(("flush", counts["turn"]))
            return "NO_REPLY"
        last = body["messages"][-1]
        if last["role"] == "tool":
            return answer(counts["turn"])
        counts["turn"] += 1
        return {"tool_calls": [{"id": f"call_{next(calls)}", "type": "function", "function": {
            "name": "read_file", "arguments": {"path": "notes.txt"}}}]}

    llm.respond_with(respond)
    return counts


def request_tokens(counter: TokenCounter, body: dict[str, Any]) -> int:
    return (sum(counter.count_message(m) for m in body["messages"])
            + counter.count_tools(body.get("tools") or []))


def pairs_intact(messages: list[dict[str, Any]]) -> bool:
    """Every tool call is answered by its result right after it, every result has its call."""
    pending: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            if m["tool_call_id"] not in pending:
                return False
            pending.discard(m["tool_call_id"])
        else:
            if pending:
                return False
            pending = {c["id"] for c in m.get("tool_calls") or ()}
    return not pending


async def test_a_6000_token_window_keeps_the_last_turns_word_for_word(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    counts = tool_model(llm)
    config = make_config(agent={"context": {"max_context_tokens": 6000}})
    counter = TokenCounter("openai/test-model")
    room = 6000 - reply_reserve(6000, None, config.agent.max_tokens)
    async with Gateway(config) as gw:
        (config.workspace_path / "notes.txt").write_text("The notes say: bring an umbrella.")
        for i in range(1, 61):
            reply = await gw.local.ask("c1", question(i), timeout=20)
            assert reply == answer(i)
            assert request_tokens(counter, llm.last_request) <= room, i
        assert counts["summary"] >= 1  # 60 turns do not fit: the older ones were summarised
        sent = llm.last_request["messages"]
        contents = [m.get("content") for m in sent]
        assert question(59) in contents and answer(59) in contents
        assert question(60) in contents
        assert pairs_intact(sent[1:])
        assert all(pairs_intact(r["messages"][1:]) for r in llm.requests
                   if not is_summary_call(r))


async def test_a_128k_model_compacts_about_once_per_100k_tokens(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    long_reply = " ".join(WORDS * 30)  # ~600 tokens a turn

    counts = {"summary": 0}
    turns = itertools.count(1)

    def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            counts["summary"] += 1
            return "SUMMARY: a long chat about words."
        if is_flush_call(body):
            return "NO_REPLY"
        return f"reply {next(turns)} {long_reply}"

    llm.respond_with(respond)
    config = make_config(agent={"context": {"max_context_tokens": 128_000}})
    async with Gateway(config) as gw:
        for i in range(200):
            await gw.local.ask("c1", f"tell me more, part {i}", timeout=20)
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        history = sum([m.tokens async for m in gw.store.all_messages(session.id)])
    assert history > 100_000
    assert 1 <= counts["summary"] <= history / 100_000, (counts, history)


async def test_a_window_too_small_is_refused_at_start_naming_the_key(
        make_config: MakeConfig) -> None:
    config = make_config(agent={"context": {"max_context_tokens": 1500}})
    with pytest.raises(ConfigError) as caught:
        async with Gateway(config):
            pass
    assert caught.value.errors[0][0] == "agent.context.max_context_tokens"
    assert "cannot hold the fixed part" in str(caught.value)


async def test_the_memory_flush_runs_once_per_cycle_before_compaction_is_due(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """At the soft threshold a silent flush turn runs; the compaction that follows some turns
    later does not flush again; each cycle flushes once."""
    events: list[tuple[str, int]] = []
    tool_model(llm, events)
    config = make_config(agent={"context": {"max_context_tokens": 6000}})
    async with Gateway(config) as gw:
        (config.workspace_path / "notes.txt").write_text("The notes say: bring an umbrella.")
        for i in range(1, 61):
            await gw.local.ask("c1", question(i), timeout=20)
    kinds = [kind for kind, _ in events]
    assert kinds.count("summary") >= 2
    # flush, summary, flush, summary ...: one flush per cycle, always before its summary
    assert kinds[:2 * kinds.count("summary")] == ["flush", "summary"] * kinds.count("summary")
    flushes = [turn for kind, turn in events if kind == "flush"]
    summaries = [turn for kind, turn in events if kind == "summary"]
    assert all(f < s for f, s in zip(flushes, summaries, strict=False))  # an earlier turn


async def test_parley_status_warns_about_a_tight_window(tmp_path: Path) -> None:
    config = write_config(tmp_path, None, context={"max_context_tokens": 3500})
    code, out, err = await parley("status", "--config", str(config))
    assert code == 1, err  # no gateway runs: status says so by its exit status
    assert "gateway:  not running" in out
    line = next(x for x in out.splitlines() if x.startswith("context:"))
    assert line.startswith("context:  3,500-token window: 437 for the reply")
    assert "warning: tight: the window of 3,500 tokens (agent.context.max_context_tokens)" \
        in out
