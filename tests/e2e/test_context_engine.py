"""The context engine through the whole gateway: compaction, overflow, replay, budgets.

The scripted model answers summary requests (recognised by their system prompt) with a
summary, and chat turns with a numbered reply.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from agent.budget import TokenCounter
from agent.compaction import SUMMARY_PROMPT
from agent.context import SUMMARY_TAG
from agent.replay import replay
from gateway.app import Gateway
from tests.conftest import MakeConfig, offered_tools
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM

SUMMARY_HEAD = SUMMARY_PROMPT[:30]


def is_summary_call(body: dict[str, Any]) -> bool:
    first = body["messages"][0]
    return first["role"] == "system" and str(first["content"]).startswith(SUMMARY_HEAD)


def is_flush_call(body: dict[str, Any]) -> bool:
    last = body["messages"][-1]
    return last["role"] == "user" and str(last["content"]).startswith("[Memory check")


def chat_model(llm: ScriptedLLM) -> list[dict[str, Any]]:
    """Answer summaries with 'SUMMARY n' and turns with 'reply n'; returns the summary calls."""
    summaries: list[dict[str, Any]] = []
    turns = itertools.count(1)

    def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            summaries.append(body)
            return f"SUMMARY {len(summaries)}: the user counted numbers."
        if is_flush_call(body):
            return "NO_REPLY"
        return f"reply {next(turns)}"

    llm.respond_with(respond)
    return summaries


async def talk(gw: Gateway, texts: list[str]) -> list[str]:
    out = []
    for text in texts:
        out.append(await gw.local.ask("c1", text, timeout=10))
    return out


async def test_compaction_is_stored_and_used(make_config: MakeConfig, llm: ScriptedLLM) -> None:
    summaries = chat_model(llm)
    config = make_config(agent={"context": {"max_recent_messages": 6}})
    async with Gateway(config) as gw:
        await talk(gw, [f"number {i}" for i in range(1, 4)])
        assert summaries == []  # 6 stored messages still fit max_recent_messages
        # 8 stored after the fourth turn would not fit the fifth: the oldest part is
        # summarised once the fourth has answered (in the background), or by the fifth
        # turn itself if it comes first; either way once, and the fifth is built on it
        await talk(gw, ["number 4", "number 5"])
        assert len(summaries) == 1
        transcript = summaries[0]["messages"][1]["content"]
        assert "User: number 1" in transcript
        turn = llm.last_request["messages"]
        assert turn[1] == {"role": "user",
                           "content": f"{SUMMARY_TAG}\nSUMMARY 1: the user counted numbers."}
        assert "number 1" not in json.dumps(turn)  # summarised, not repeated
        assert [m["content"] for m in turn[2:4]] == ["number 4", "reply 4"]
        assert turn[-1]["content"] == "number 5"
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        entry = await gw.store.compaction(session.id)
        assert entry is not None and entry.tokens_before > 0
        assert entry.messages_summarised == 6
        assert session.message_count == 10  # the full history stays in the database
        snap = await gw.store.latest_snapshot(session.id)
        assert snap is not None and snap["layers"]["summary"] > 0
        # later turns keep using the summary
        await talk(gw, ["number 6"])
        assert llm.last_request["messages"][1]["content"].startswith(SUMMARY_TAG)


async def test_manual_compact_with_focus(make_config: MakeConfig, llm: ScriptedLLM) -> None:
    summaries = chat_model(llm)
    async with Gateway(make_config()) as gw:
        await talk(gw, ["my cat is called Miso", "I live in Lyon", "what's the weather?"])
        notice = await gw.local.ask("c1", "/compact the cat", timeout=10)
        assert notice.startswith("Compacted ") and "summary" in notice
        assert "Pay particular attention to: the cat" in summaries[0]["messages"][0]["content"]
        assert await gw.local.ask("c1", "/compact", timeout=10) == \
            "Nothing was compacted: nothing to compact yet."  # only the last exchange is left
        await talk(gw, ["and now?"])
        sent = llm.last_request["messages"]
        assert sent[1]["content"].startswith(SUMMARY_TAG)
        assert [m["content"] for m in sent[2:4]] == ["what's the weather?", "reply 3"]


async def test_failed_summary_keeps_history_and_says_so(make_config: MakeConfig,
                                                        llm: ScriptedLLM) -> None:
    turns = itertools.count(1)

    def respond(body: dict[str, Any]) -> Any:
        if is_summary_call(body):
            return {"content": ""}  # an empty summary counts as a failure
        return f"reply {next(turns)}"

    llm.respond_with(respond)
    config = make_config(agent={"context": {"max_recent_messages": 4,
                                            "compaction": {"memory_flush": False}}})
    async with Gateway(config) as gw:
        await talk(gw, ["one", "two", "three"])
        await gw.local.inject("c1", "four")  # 6 stored messages > 4: due for compaction
        records: list[dict[str, Any]] = []
        while len(records) < 5:
            found, _ = await gw.local.wait_messages("c1", after=len(records), timeout=10)
            assert found
            records += found
        notice, reply = records[3], records[4]
        assert notice["kind"] == "notice" and "couldn't summarise" in notice["text"]
        assert reply["text"] == "reply 4"
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        assert await gw.store.compaction(session.id) is None
        assert session.message_count == 8


async def test_context_overflow_compacts_and_retries_once(make_config: MakeConfig,
                                                          llm: ScriptedLLM) -> None:
    llm.reply("reply 1").reply("reply 2")
    overflow = ("This model's maximum context length is 4096 tokens. However, your messages "
                "resulted in 5000 tokens.")
    config = make_config(agent={"max_retries": 0, "context": {"compaction": {
        "memory_flush": False}}})
    async with Gateway(config) as gw:
        await talk(gw, ["one", "two"])
        llm.error(400, overflow).reply("SUMMARY: one and two").reply("after compaction")
        assert await gw.local.ask("c1", "three", timeout=10) == "after compaction"
        assert is_summary_call(llm.requests[-2])
        assert llm.last_request["messages"][1]["content"].startswith(SUMMARY_TAG)
        llm.assert_all_used()


async def test_replay_rebuilds_the_same_context(make_config: MakeConfig,
                                                llm: ScriptedLLM) -> None:
    chat_model(llm)
    config = make_config(agent={"context": {"max_recent_messages": 6}})
    async with Gateway(config) as gw:
        await talk(gw, [f"number {i}" for i in range(1, 7)])
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snaps = await gw.store.snapshots(session.id)
        turn_requests = [r for r in llm.requests
                         if not is_summary_call(r) and not is_flush_call(r)]
        assert len(snaps) == len(turn_requests) == 6
        for snap, sent in zip(snaps, turn_requests, strict=True):
            rebuilt = await replay(gw.store, config, session.id, snap)
            assert rebuilt.matches
            assert rebuilt.messages == sent["messages"]  # exactly what the model was sent
        (config.workspace_path / "SOUL.md").write_text("A different soul.")
        again = await replay(gw.store, config, session.id, snaps[-1])  # texts are stored
        assert again.matches and again.messages == turn_requests[-1]["messages"]


async def test_long_tool_loop_shortens_old_results_to_fit(make_config: MakeConfig,
                                                          llm: ScriptedLLM) -> None:
    config = make_config(agent={"context": {"max_context_tokens": 6000,
                                            "reply_reserve_tokens": 500}})
    async with Gateway(config) as gw:
        big = "\n".join(f"line {i} " + "word " * 40 for i in range(200))
        (config.workspace_path / "big.txt").write_text(big)
        for i in range(3):
            llm.tool_call("read_file", {"path": "big.txt", "offset": 1 + i * 50, "limit": 50})
        llm.reply("read it all")
        assert await gw.local.ask("c1", "read big.txt", timeout=20) == "read it all"
        last = llm.last_request["messages"]
        tools = [m["content"] for m in last if m["role"] == "tool"]
        assert tools[0].startswith("[shortened to fit the context window]")
        assert not tools[-1].startswith("[shortened")
        total = TokenCounter("openai/test-model").count_text(json.dumps(last))
        assert total < 6000
        assert gw.store is not None  # the shortened results replay too, call by call
        session = await gw.store.active_session("local:c1")
        snap = (await gw.store.snapshots(session.id))[-1]
        rebuilt = await replay(gw.store, config, session.id, snap)
        assert any(c["shortened"] for c in snap["calls"]) and rebuilt.matches
        assert [c.messages for c in rebuilt.calls] == [r["messages"] for r in llm.requests]


async def test_first_hello_costs_at_most_1500_tokens_with_every_tool(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.reply("hi")
    config = make_config(agent={"tools": {"web": {"search": {
        "provider": "searxng", "base_url": "http://127.0.0.1:9"}}}})
    async with Gateway(config) as gw:  # the workspace `parley onboard` writes
        await gw.local.ask("c1", "hello", timeout=10)
    body = llm.last_request
    # every tool, offered or named (exec too where bubblewrap is installed, as `make test` does)
    assert offered_tools(body) >= {"web_search", "cron", "spawn", "message", "memory",
                                   "session_search"}
    for model in ("openai/gpt-4o-mini", "openai/test-model"):
        counter = TokenCounter(model)
        tokens = sum(counter.count_message(m) for m in body["messages"])
        tokens += counter.count_tools(body["tools"])
        assert tokens <= 1500, (model, tokens)


async def test_system_prompt_is_stable_and_bootstrap_cuts_are_visible(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.echo()
    config = make_config(agent={"context": {"bootstrap_max_chars": 1000}})
    async with Gateway(config) as gw:
        (config.workspace_path / "USER.md").write_text("# About me\n" + "I like tea. " * 400)
        await talk(gw, ["one", "two"])
        first, second = llm.requests[-2], llm.requests[-1]
        assert first["messages"][0]["content"] == second["messages"][0]["content"]
        system = first["messages"][0]["content"]
        assert "characters of USER.md cut here to fit the 1,000-character limit" in system
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snap = await gw.store.latest_snapshot(session.id)
        assert snap is not None and snap["bootstrap_cuts"][0].startswith("USER.md: cut from")


async def test_memory_recall_goes_into_the_runtime_block(make_config: MakeConfig,
                                                         llm: ScriptedLLM) -> None:
    llm.echo()
    config = make_config()
    async with Gateway(config) as gw:
        logs = config.workspace_path / "memory"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "2026-11-20.md").write_text(
            "# 2026-11-20\n\n[09:10] The dentist appointment is on Friday at 15:00.\n\n"
            "[11:00] Ordered a new bicycle tyre.\n")
        await gw.local.ask("c1", "when is my dentist appointment?", timeout=10)
        runtime = llm.last_request["messages"][-2]["content"]
        assert "Memory recall (may be relevant):" in runtime
        assert "dentist appointment is on Friday" in runtime and "bicycle" not in runtime
        await gw.local.ask("c1", "hello", timeout=10)
        assert "Memory recall" not in llm.last_request["messages"][-2]["content"]
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snaps = await gw.store.snapshots(session.id)
        assert snaps[0]["sources"]["memory_recalled"] == 1
        (logs / "2026-11-20.md").write_text("forgotten")  # memory changed since: replay holds
        assert (await replay(gw.store, config, session.id, snaps[0])).matches


async def test_memory_flush_before_compaction_is_silent(make_config: MakeConfig,
                                                        llm: ScriptedLLM) -> None:
    turns = itertools.count(1)
    flushes: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if is_summary_call(body):
            return "SUMMARY: the user has a cat."
        if last["role"] == "user" and "[Memory check" in str(last["content"]):
            flushes.append(body)
            return {"tool_calls": [{"id": "call_m1", "type": "function", "function": {
                "name": "memory",
                "arguments": {"action": "remember", "text": "The user's cat is Miso.",
                              "kind": "fact"}}}]}
        if last["role"] == "tool":
            return "NO_REPLY"
        return f"reply {next(turns)}"

    llm.respond_with(respond)
    config = make_config(agent={"context": {"max_recent_messages": 4}})
    async with Gateway(config) as gw:
        await talk(gw, ["my cat is Miso", "she is grey"])
        assert flushes == []
        await talk(gw, ["she is 3"])  # the next turn would not fit: flush and summary follow
        assert gw.agent is not None
        background = gw.agent.background
        await until(lambda: background.idle, "the background flush and summary")
        assert await gw.local.ask("c1", "tell me about her", timeout=10) == "reply 4"
        assert len(flushes) == 1
        assert "The user's cat is Miso." in (config.workspace_path / "MEMORY.md").read_text()
        found, _ = await gw.local.wait_messages("c1", timeout=1)
        assert [r["text"] for r in found] == ["reply 1", "reply 2", "reply 3", "reply 4"]
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        assert session.message_count == 8  # nothing of the flush turn is in the conversation


async def test_summaries_stay_within_their_cap(make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """Each summary carries the previous one: an overlong answer must not snowball."""
    turns = itertools.count(1)
    summaries: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            summaries.append(body)
            return "The user keeps counting. " * 200  # far more than asked for
        return f"reply {next(turns)}"

    llm.respond_with(respond)
    config = make_config(agent={"context": {"max_recent_messages": 4, "compaction": {
        "memory_flush": False, "summary_max_tokens": 60}}})
    async with Gateway(config) as gw:
        await talk(gw, [f"n{i}" for i in range(8)])
        assert len(summaries) >= 2
        assert all(s["max_tokens"] == 60 for s in summaries)
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        entry = await gw.store.compaction(session.id)
        assert entry is not None and entry.summary_tokens <= 62
        assert entry.summary.endswith("[…]")
