"""Several processes (issue 19): a process given up for dead while a turn ran finds, when it
writes that turn, that another process took the message over. It stores nothing, sends no
error into the chat (the other process answers) and goes on; no traceback."""

from __future__ import annotations

import logging

import pytest

from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM


async def test_a_turn_whose_message_was_taken_over_stores_and_sends_nothing(
        make_config: MakeConfig, llm: ScriptedLLM, postgres_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    gate = llm.hold()
    llm.reply("late answer")
    llm.echo()
    config = make_config(database=postgres_url, cluster={"lease": "30s"})
    async with Gateway(config) as gw:
        assert gw.store is not None
        await gw.local.inject("c1", "hello")
        await llm.wait_in_flight(1)
        # meanwhile the others gave this process up and one of them claimed the message
        await gw.store._write(lambda db: db.execute(
            "UPDATE inbox SET claimed_by = 'elsewhere:1:abc' WHERE chat_id = 'c1'"))
        with caplog.at_level(logging.WARNING):
            gate.release()
            await until(lambda: any("took its message over" in r.getMessage()
                                    for r in caplog.records), lambda: caplog.text, timeout=10)
        assert await gw.store.fetchall("SELECT 1 FROM messages") == []  # nothing stored
        rows = await gw.store.fetchall("SELECT status, claimed_by FROM inbox WHERE chat_id = 'c1'")
        assert [(r[0] != "done", r[1]) for r in rows] == [(True, "elsewhere:1:abc")]
        # no error told into the chat, no traceback; the process goes on answering
        assert await gw.local.ask("c2", "still there?", timeout=10) == "echo: still there?"
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        replies = await gw.store.fetchall(
            "SELECT record FROM local_replies WHERE chat_id = 'c1'")
        assert replies == []
