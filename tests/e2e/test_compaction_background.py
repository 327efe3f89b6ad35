"""Compaction off the critical path (issue 24): a long chat never waits for a summary while
its history fits. The scripted model holds every summary call until the test has had the
next user turn answered meanwhile; only then is the summary released."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp

from gateway.app import Gateway
from tests.channels.webchat_page import Page, channel_of
from tests.conftest import MakeConfig
from tests.e2e.test_context_engine import is_flush_call, is_summary_call
from tests.e2e.test_context_window import WORDS
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM


def question(i: int) -> str:
    return f"question {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(15))


async def test_a_200_turn_chat_never_waits_for_a_summary_while_it_fits(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    turns = itertools.count(1)
    gate = asyncio.Event()
    held: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []

    async def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            held.append(body)
            await gate.wait()  # held until the test has had a turn answered meanwhile
            summaries.append(body)
            return f"SUMMARY {len(summaries)}: numbered questions about words."
        if is_flush_call(body):
            return "NO_REPLY"
        return f"reply {next(turns)}"

    llm.respond_with(respond)
    config = make_config(agent={"context": {"max_context_tokens": 6000}})
    answered_while_held = 0
    async with Gateway(config) as gw:
        assert gw.agent is not None
        background = gw.agent.background
        i = 0
        while i < 200:
            i += 1
            assert await gw.local.ask("c1", question(i), timeout=20) == f"reply {i}"
            # after that turn answered, a memory flush (answered at once) or a summary may
            # have started in the background: a summary is held, and the next turn is
            # answered all the same
            await until(lambda: background.idle or len(held) > len(summaries),
                        "the background work or its summary call")
            if len(held) == len(summaries):
                continue
            i += 1
            assert await gw.local.ask("c1", question(i), timeout=20) == f"reply {i}"
            assert len(held) > len(summaries)  # still held: the turn did not wait for it
            answered_while_held += 1
            gate.set()
            await until(lambda: background.idle, "the summary to be stored")
            gate.clear()
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        entry = await gw.store.compaction(session.id)
    assert len(summaries) >= 2 and entry is not None
    assert answered_while_held == len(summaries)
    assert background.waited == 0  # no turn waited for a summary
    last = llm.last_request["messages"]
    assert str(last[1]["content"]).endswith(entry.summary)


async def test_a_shutdown_mid_summary_loses_nothing(make_config: MakeConfig,
                                                   llm: ScriptedLLM) -> None:
    """The background summary is held when the gateway stops: it is cancelled, nothing of it
    is stored, the history stays whole, and after the restart the chat goes on."""
    turns = itertools.count(1)
    gate = asyncio.Event()
    held: list[dict[str, Any]] = []

    async def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            held.append(body)
            await gate.wait()
            return "SUMMARY: numbered questions."
        if is_flush_call(body):
            return "NO_REPLY"
        return f"reply {next(turns)}"

    llm.respond_with(respond)
    config = make_config(agent={"context": {"max_recent_messages": 6, "compaction": {
        "memory_flush": False}}})
    async with Gateway(config, grace=0.2) as gw:
        for i in range(1, 5):
            assert await gw.local.ask("c1", f"number {i}", timeout=10) == f"reply {i}"
        await until(lambda: bool(held), "the background summary call")
    # stopped with the summary held
    assert not gate.is_set()
    gate.set()
    async with Gateway(config) as gw:
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        assert session.message_count == 8  # the history, whole
        assert await gw.store.compaction(session.id) is None  # nothing of the cancelled one
        assert await gw.local.ask("c1", "number 5", timeout=10) == "reply 5"
        assert len(held) >= 2  # summarised again after the restart, by that turn or after


async def test_a_turn_that_cannot_fit_waits_for_the_running_summary_and_says_so(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """More messages stored than the window reads while the background summary of them is
    still running: the next turn cannot fit without it, so the chat is told in progress (a
    WebChat page sees the line live), the turn waits for that summary and is built on it, and
    the span is summarised once (the turn's own summary finds it done, not made twice)."""
    turns = itertools.count(1)
    gate = asyncio.Event()
    held: list[dict[str, Any]] = []
    turn_five: list[tuple[int, dict[str, Any]]] = []  # (summary calls made by then, request)

    async def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            held.append(body)
            await gate.wait()
            return f"SUMMARY {len(held)}: the user counted from one."
        if is_flush_call(body):
            return "NO_REPLY"
        n = next(turns)
        if n == 5:
            turn_five.append((len(held), body))
        return f"reply {n}"

    llm.respond_with(respond)
    config = make_config(
        channels={"webchat": {"enabled": True, "port": 0}},
        agent={"context": {"max_recent_messages": 6, "compaction": {"memory_flush": False}}})
    async with Gateway(config) as gw, aiohttp.ClientSession() as http:
        assert gw.agent is not None
        background = gw.agent.background
        conn = await Page(http, str(channel_of(gw).base_url)).connect()
        for i in range(1, 5):
            await conn.message(f"number {i}", f"msg-{i:08d}")
            assert (await conn.reply())["text"] == f"reply {i}"
        await until(lambda: bool(held), "the background summary call")
        await conn.message("number 5", "msg-00000005")
        await conn.until(lambda f: f["type"] == "progress"
                                    and f["text"] == "summarising the earlier conversation")
        assert not [f for f in conn.seen if f["type"] == "message"
                    and f["message"]["text"] == "reply 5"]
        assert background.waited == 1 and len(held) == 1 and not turn_five
        gate.set()
        assert (await conn.reply())["text"] == "reply 5"
    [(summaries_by_then, request)] = turn_five
    assert summaries_by_then == 1  # the running one only: not summarised a second time
    assert "SUMMARY 1: the user counted from one." in str(request["messages"][1]["content"])
    assert "number 1" not in json.dumps(request["messages"])  # summarised, not repeated
