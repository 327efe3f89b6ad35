"""Recall of past conversations (issue 21): ``session_search`` over SQLite FTS5 (trigram),
only ever the asking chat's (and a guest's own) messages; ``parley sessions search``."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from gateway.app import Gateway
from gateway.kernel.store_search import TRIGRAM
from tests.conftest import MakeConfig
from tests.e2e.test_cli import parley, write_config
from tests.e2e.test_context_engine import is_flush_call, is_summary_call
from tests.fakes.openai_server import ScriptedLLM


def results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def plain_model(llm: ScriptedLLM) -> None:
    turns = itertools.count(1)

    def respond(body: dict[str, Any]) -> str:
        if is_summary_call(body):
            return "SUMMARY: small talk."
        if is_flush_call(body):
            return "NO_REPLY"
        return f"ok {next(turns)}"

    llm.respond_with(respond)


async def test_a_word_from_500_turns_back_and_never_another_chats(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    assert TRIGRAM  # SQLite 3.34+: the test machine's is; the fallback is tested below
    plain_model(llm)
    config = make_config(agent={"context": {"max_context_tokens": 8000}})
    async with Gateway(config) as gw:
        await gw.local.ask("c1", "my locker code is zephyrquokka-1234", timeout=10)
        await gw.local.ask("c2", "the other chat's zephyrquokka-9999 stays there", timeout=10)
        await gw.local.ask("c1", "東京タワーの近くに住んでいます", timeout=10)
        for i in range(500):
            await gw.local.ask("c1", f"small talk number {i}", timeout=10)
        llm.tool_call("session_search", {"query": "zephyrquokka"})
        llm.tool_call("session_search", {"query": "京タワ"})
        llm.reply("found it")
        assert await gw.local.ask("c1", "what was my locker code?", timeout=10) == "found it"
        found, cjk = results(llm.last_request)[-2:]
        assert "zephyrquokka-1234" in found and "9999" not in found
        assert "東京タワー" in cjk
        # the summary long replaced those turns: the search reaches past compactions
        sent = str(llm.last_request["messages"][:-4])
        assert "zephyrquokka" not in sent


async def test_a_guest_in_a_group_finds_only_their_own_turns(make_config: MakeConfig,
                                                             llm: ScriptedLLM) -> None:
    config = make_config(agent={"trust": {"guest": {"tools": ["session_search"]}}})
    plain_model(llm)
    async with Gateway(config) as gw:
        group = {"chat_type": "group", "mentioned": True, "trust": "guest"}
        await gw.local.ask("g1", "my wombatcode is 111", sender_id="ann", **group)
        await gw.local.ask("g1", "my wombatcode is 222", sender_id="bob", **group)
        llm.tool_call("session_search", {"query": "wombatcode"})
        llm.reply("yours is 111")
        await gw.local.ask("g1", "what is my wombatcode?", sender_id="ann", **group)
        [found] = results(llm.last_request)
        assert "111" in found and "222" not in found
        # words under three letters are looked for as substrings (LIKE), in the same scope
        llm.tool_call("session_search", {"query": "is"})
        llm.reply("still 111")
        await gw.local.ask("g1", "again?", sender_id="ann", **group)
        found = results(llm.last_request)[-1]
        assert "111" in found and "222" not in found


async def test_parley_sessions_search_and_context_show_full(tmp_path: Path,
                                                             llm: ScriptedLLM) -> None:
    llm.reply("noted")
    config = str(write_config(tmp_path, llm))
    code, _, err = await parley("chat", "-m", "the keeper was called Morwenna", "--config",
                                config)
    assert code == 0, err
    code, out, err = await parley("sessions", "search", "morwenna", "--config", config)
    assert code == 0, err
    assert "terminal:terminal" in out and "Morwenna" in out
    code, out, _ = await parley("sessions", "search", "morwenna", "--chat", "local:c2",
                                "--config", config)
    assert code == 0 and "no message matches 'morwenna'" in out
    soul = tmp_path / "ws" / "SOUL.md"
    soul.write_text(soul.read_text() + "\nBe brief.")
    code, out, err = await parley("context", "show", "terminal:terminal", "--full",
                                  "--config", config)
    assert code == 0, err
    assert "replayed from the database: matches the stored hash" in out
