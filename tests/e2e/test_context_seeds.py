"""The seed points of issue 21: the runtime block's queue and last-status lines, a
classified context_build_error, BOOTSTRAP.md and extra bootstrap files, skill folders with
precedence and ``requires`` on config keys and the OS."""

from __future__ import annotations

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


def system_of(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


async def test_bootstrap_md_is_for_the_owner_and_extra_files_for_everyone(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(agent={"context": {"bootstrap": {"extra_files": ["docs/HOUSE.md"]}}})
    async with Gateway(config) as gw:
        ws = config.workspace_path
        (ws / "BOOTSTRAP.md").write_text("Ask the owner for their name, then fill in USER.md.")
        (ws / "docs").mkdir()
        (ws / "docs" / "HOUSE.md").write_text("House rules: no spoilers.")
        llm.reply("hi").reply("hi guest")
        await gw.local.ask("c1", "hello", timeout=10)
        owner = system_of(llm.last_request)
        assert "# First run (BOOTSTRAP.md)" in owner and "Ask the owner" in owner
        assert owner.index("Ask the owner") < owner.index("# Soul")
        assert owner.index("# Tool notes") < owner.index("House rules") < owner.index("# Memory")
        await gw.local.ask("c2", "hello", timeout=10, trust="guest")
        guest = system_of(llm.last_request)
        assert "Ask the owner" not in guest and "House rules: no spoilers." in guest
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snap = (await gw.store.snapshots(session.id))[-1]
        assert {"BOOTSTRAP.md", "docs/HOUSE.md"} <= set(snap["layers"])


def skill(folder: Path, name: str, description: str, requires: str = "") -> Path:
    path = folder / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = f"requires: {requires}\n" if requires else ""
    path.write_text(f"---\nname: {name}\ndescription: {description}\n{extra}---\nDo {name}.")
    return path


def skill_lines(request: dict[str, Any]) -> dict[str, str]:
    lines = system_of(request).split("# Skills\n", 1)[1].split("\n\n---")[0].splitlines()
    return {line[2:].split(":", 1)[0]: line for line in lines if line.startswith("- ")}


async def test_skill_folders_take_precedence_in_order_and_requires_is_checked(
        make_config: MakeConfig, llm: ScriptedLLM, tmp_path: Path) -> None:
    shared, mine = tmp_path / "shared-skills", tmp_path / "my-skills"
    config = make_config(agent={"skills": {"folders": [str(shared)],
                                           "user_folder": str(mine)}})
    skill(shared, "alpha", "from the folder")
    beta = skill(shared, "beta", "only in the folder")
    skill(mine, "alpha", "from my skills")
    skill(mine, "gamma", "needs web search", "{config: [agent.tools.web.search.provider]}")
    skill(mine, "delta", "needs plan9", "{os: [plan9]}")
    skill(mine, "epsilon", "any usual os", "{os: [linux, darwin, windows]}")
    async with Gateway(config) as gw:
        skill(config.workspace_path / "skills", "alpha", "from the workspace")
        llm.reply("one")
        await gw.local.ask("c1", "hello", timeout=10)
        lines = skill_lines(llm.last_request)
        assert "from the workspace" in lines["alpha"]
        assert "only in the folder" in lines["beta"] and str(beta) in lines["beta"]
        assert "unavailable: missing config agent.tools.web.search.provider" in lines["gamma"]
        assert "unavailable: missing os plan9" in lines["delta"]
        assert lines["epsilon"].endswith("available)")
        assert "write-skill" in lines  # the built-in ones stay
        (config.workspace_path / "skills" / "alpha" / "SKILL.md").unlink()
        # a skill outside the workspace is read where it lies; its folder's parent is not
        llm.tool_call("read_file", {"path": str(beta)})
        llm.tool_call("read_file", {"path": str(tmp_path / "my-skills" / ".." / "secret.txt")})
        llm.reply("two")
        (tmp_path / "secret.txt").write_text("0451")
        await gw.local.ask("c1", "use beta", timeout=10)
        assert "from my skills" in skill_lines(llm.requests[-3])["alpha"]
        results = [m["content"] for m in llm.last_request["messages"] if m["role"] == "tool"]
        assert "Do beta." in results[0]
        assert "0451" not in results[1] and "outside the workspace" in results[1]
