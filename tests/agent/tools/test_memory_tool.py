"""The memory tool through the real registry: what the model sends and what it reads back."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.budget import TokenCounter
from agent.tools import build_registry
from agent.tools.base import ToolRegistry
from agent.turn import TurnContext
from gateway.kernel.config import MemoryConfig, ToolsConfig
from gateway.kernel.events import InboundMessage
from workspace.memory import memory_store_for, person_scope

NO_OTHER_TOOLS = ToolsConfig.model_validate(
    {group: {"enabled": False} for group in ("files", "exec", "message", "cron", "web", "spawn")})
RECEIVED = datetime(2026, 11, 20, 23, 30, tzinfo=UTC)
OWN = "memory/people/local+u1"
"""Where the owner's notes said as local user u1 go (MEMORY.md facts stay at the top)."""


def registry(**config: Any) -> ToolRegistry:
    return build_registry(NO_OTHER_TOOLS, memory=MemoryConfig(**config), timezone="Europe/Berlin")


def make_ctx(workspace: Path) -> TurnContext:
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner",
                                              text="", received_at=RECEIVED),
                       session_id=1, workspace=workspace)


async def call(reg: ToolRegistry, ws: Path, **args: Any) -> tuple[str, bool]:
    result = await reg.execute("memory", json.dumps(args), make_ctx(ws))
    return result.text, result.is_error


async def test_remember_then_search(tmp_path: Path) -> None:
    reg = registry()
    text, err = await call(reg, tmp_path, action="remember",
                           text="Booked the dentist for Tuesday 10:00.")
    assert (text, err) == (f"Saved to {OWN}/2026-11-21.md.", False)  # Berlin: past midnight
    text, err = await call(reg, tmp_path, action="remember", kind="fact",
                           text="Sam's dentist is Dr. Weber.")
    assert (text, err) == ("Saved to MEMORY.md.", False)
    text, _ = await call(reg, tmp_path, action="remember", kind="fact",
                         text="Sam's dentist is Dr. Weber.")
    assert text == "Already in MEMORY.md; nothing written."

    text, err = await call(reg, tmp_path, action="search", text="dentist appointment")
    assert not err
    assert text == ("MEMORY.md:3\n- Sam's dentist is Dr. Weber.\n\n"
                    f"{OWN}/2026-11-21.md:3\n[00:30] Booked the dentist for Tuesday 10:00.")
    text, err = await call(reg, tmp_path, action="search", text="passport")
    assert not err and text.startswith("No memory matches 'passport'")


async def test_full_memory_md_is_an_error_the_model_can_act_on(tmp_path: Path) -> None:
    (tmp_path / "MEMORY.md").write_text("# Memory\n\n- " + "fact " * 40 + "\n")
    text, err = await call(registry(max_memory_chars=220), tmp_path, action="remember",
                           kind="fact", text="One more lasting fact about Sam.")
    assert err and text.startswith("Error: MEMORY.md is full")
    assert "rewrite MEMORY.md shorter" in text


async def test_bad_arguments_go_back_as_errors(tmp_path: Path) -> None:
    reg = registry()
    text, err = await call(reg, tmp_path, action="forget", text="x")
    assert err and "action" in text
    text, err = await call(reg, tmp_path, action="remember", text="   ")
    assert err and "empty" in text
    assert not (tmp_path / "memory").exists()


async def test_without_daily_logs_every_note_is_a_fact(tmp_path: Path) -> None:
    reg = registry(daily_log=False)
    tool = reg.get("memory")
    assert tool is not None and "kind" not in tool.parameters["properties"]
    text, err = await call(reg, tmp_path, action="remember", text="Sam lives in Lyon.")
    assert (text, err) == ("Saved to MEMORY.md.", False)
    # an argument the schema doesn't offer is refused, so the model learns to drop it
    text, err = await call(reg, tmp_path, action="remember", kind="log", text="Likes tea.")
    assert err and "kind" in text
    assert not (tmp_path / "memory").exists()


def test_switch_and_schema_size() -> None:
    assert "memory" not in build_registry(NO_OTHER_TOOLS, memory=MemoryConfig(enabled=False)).names
    assert "memory" not in build_registry(NO_OTHER_TOOLS).names
    tool = registry().get("memory")
    assert tool is not None
    # Sent with every request: keep it small.
    assert TokenCounter("openai/gpt-4o-mini").count_tools([tool.schema()]) <= 150


async def test_concurrent_turns_both_land(tmp_path: Path) -> None:
    reg = registry()
    notes = [f"note {i}: parcel number {1000 + i} arrived" for i in range(10)]
    results = await asyncio.gather(*(call(reg, tmp_path, action="remember", text=n)
                                     for n in notes))
    assert all(not err for _, err in results)
    log = (tmp_path / OWN / "2026-11-21.md").read_text()
    assert all(f"[00:30] {n}\n" in log for n in notes)


async def test_tool_and_recall_share_one_store(tmp_path: Path) -> None:
    await call(registry(), tmp_path, action="remember", text="The boiler was serviced.")
    store = memory_store_for(tmp_path, MemoryConfig(), timezone="Europe/Berlin",
                             scope=person_scope("local:u1"))
    block = store.recall("is the boiler ok?", counter=TokenCounter("openai/gpt-4o-mini"))
    assert block is not None and \
        f"[{OWN}/2026-11-21.md] [00:30] The boiler was serviced." in block
