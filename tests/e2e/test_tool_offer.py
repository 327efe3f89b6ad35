"""A lean first request (issue 21): core tools in full, the rest named in one line and loaded
when the model asks; never beyond what the sender may use."""

from __future__ import annotations

from typing import Any

from gateway.app import Gateway
from tests.conftest import MakeConfig, offered_tools
from tests.fakes.openai_server import ScriptedLLM


def full(request: dict[str, Any]) -> set[str]:
    return offered_tools(request, loadable=False)


def results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_a_loaded_tool_is_offered_from_the_next_call_and_while_in_use(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    async with Gateway(make_config()) as gw:
        llm.tool_call("load_tools", {"names": ["cron"]})
        llm.tool_call("cron", {"action": "list"})
        llm.reply("no jobs")
        assert await gw.local.ask("c1", "what is scheduled?", timeout=10) == "no jobs"
        first, second, third = llm.requests[-3:]
        assert "cron" not in full(first) and "cron" in offered_tools(first)
        assert "cron" in full(second) and "load_tools" in full(second)
        assert results(second) == ["Loaded cron: call them now."]
        assert "Error" not in results(third)[-1]
        # the conversation used cron: the next turn offers it from the start
        llm.reply("still none")
        await gw.local.ask("c1", "and now?", timeout=10)
        assert "cron" in full(llm.last_request)
        # a fresh chat does not
        llm.reply("hi")
        await gw.local.ask("c2", "hello", timeout=10)
        assert "cron" not in full(llm.last_request)
        # and the turn after next still does (only its new messages are read for calls)
        llm.reply("none yet")
        await gw.local.ask("c1", "any now?", timeout=10)
        assert "cron" in full(llm.last_request)


async def test_a_guest_cannot_load_what_it_may_not_use(make_config: MakeConfig,
                                                       llm: ScriptedLLM) -> None:
    async with Gateway(make_config()) as gw:
        llm.tool_call("load_tools", {"names": ["cron", "exec"]})
        llm.tool_call("cron", {"action": "list"})
        llm.reply("sorry")
        assert await gw.local.ask("c1", "schedule something", timeout=10,
                                  trust="guest") == "sorry"
        first, second, third = llm.requests[-3:]
        assert not offered_tools(first) & {"cron", "exec", "write_file", "spawn"}
        assert "message" in offered_tools(first)  # a guest's own, named in the one line
        assert results(second)[0].startswith("Error: cannot load cron, exec")
        assert "cron" not in full(third)
        assert "not available in this conversation" in results(third)[-1]


async def test_core_all_offers_every_tool_in_full(make_config: MakeConfig,
                                                  llm: ScriptedLLM) -> None:
    config = make_config(agent={"tools": {"core": ["*"]}})
    async with Gateway(config) as gw:
        llm.reply("hi")
        await gw.local.ask("c1", "hello", timeout=10)
        assert {"cron", "spawn", "message"} <= full(llm.last_request)
        assert "load_tools" not in full(llm.last_request)


async def test_an_always_on_skill_loads_the_tools_it_names(make_config: MakeConfig,
                                                           llm: ScriptedLLM) -> None:
    config = make_config()
    async with Gateway(config) as gw:
        folder = config.workspace_path / "skills" / "reminders"
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text("---\nname: reminders\ndescription: set reminders\n"
                                         "always: true\ntools: [cron]\n---\nUse cron.")
        llm.reply("hi")
        await gw.local.ask("c1", "hello", timeout=10)
        assert "cron" in full(llm.last_request) and "spawn" not in full(llm.last_request)
