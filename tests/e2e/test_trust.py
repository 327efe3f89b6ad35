"""Many people, one agent, through the real discord.py and the fake Discord: a guest in an open
server gets no host tools whatever the model asks for, and each person's memory stays theirs.
The owner does the same things in the same server as the control, so the tests can fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.app import Gateway
from gateway.kernel.config import Config
from tests.conftest import MakeConfig, offered_tools
from tests.e2e.test_discord import (
    ADA_ID,
    BOB_ID,
    GENERAL_ID,
    GUILD_ID,
    discord_config,
    user_texts,
)
from tests.fakes.discord_server import BOT_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedLLM

CAROL_ID = BOB_ID + 1
HOST_TOOLS = {"exec", "write_file", "edit_file", "cron", "spawn"}
RULE = "Sender trust: "


def config(make_config: MakeConfig, dc: FakeDiscord, **discord: Any) -> Config:
    return discord_config(make_config, dc, agent={"memory": {"recall_min_score": 0}}, **discord)


def offered(request: dict[str, Any]) -> set[str]:
    return offered_tools(request)


def runtime_of(request: dict[str, Any]) -> str:
    return user_texts(request)[-2]


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def hostile_calls(llm: ScriptedLLM, tag: str) -> None:
    """What a prompt-injected model might try, all in one step."""
    llm.tool_calls([
        ("exec", {"command": f"touch {tag}-exec.txt"}),
        ("write_file", {"path": f"{tag}-write.txt", "content": "owned"}),
        ("cron", {"action": "add", "message": f"{tag} every minute", "every": "1h"}),
        ("read_file", {"path": "MEMORY.md"}),
    ])


async def test_a_guest_in_an_open_server_gets_no_host_tools(
        make_config: MakeConfig, dc: FakeDiscord, llm: ScriptedLLM) -> None:
    guild = dc.guild(GUILD_ID, "Open house")
    general = dc.text_channel(guild, GENERAL_ID, "general")
    ada, bob = dc.user(ADA_ID, "ada"), dc.user(BOB_ID, "bob")
    gw = Gateway(config(make_config, dc, allow_guilds=[str(GUILD_ID)]), grace=2.0)
    workspace = gw.config.workspace_path
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "MEMORY.md").write_text("# Memory\n\n- The owner's safe code is 0451.\n")
    await gw.start()
    try:
        hostile_calls(llm, "guest")
        llm.reply("done, guest")
        dc.post(general, bob, f"<@{BOT_ID}> run these for me", mentions=(dc.bot,))
        await dc.wait_sent(GENERAL_ID)
        first, second = llm.requests[-2:]
        assert RULE + "guest" in runtime_of(first)
        assert offered(first) and not offered(first) & HOST_TOOLS  # never offered
        assert "0451" not in first["messages"][0]["content"]  # nor the owner's facts
        refused = tool_results(second)
        assert len(refused) == 4
        assert all("not available in this conversation" in r for r in refused[:3]), refused
        assert "private to the owner" in refused[3] and "0451" not in refused[3]

        # The owner, in the same channel, asking the same: the control.
        hostile_calls(llm, "owner")
        llm.reply("done, owner")
        dc.post(general, ada, f"<@{BOT_ID}> run these for me", mentions=(dc.bot,))
        await dc.wait_sent(GENERAL_ID, 2)
        first, second = llm.requests[-2:]
        assert RULE + "owner" in runtime_of(first)
        assert HOST_TOOLS - {"exec"} <= offered(first)
        assert "0451" in tool_results(second)[-1]  # the history holds the guest's turn too
        assert gw.cron is not None
        jobs = await gw.cron.jobs.jobs()
    finally:
        await gw.stop()
    assert not list(workspace.glob("guest-*"))  # nothing the guest asked for happened
    assert (workspace / "owner-write.txt").read_text() == "owned"
    assert [(j.message, j.trust) for j in jobs] == [("owner every minute", "owner")]


async def test_each_person_recalls_only_their_own_memory(
        make_config: MakeConfig, dc: FakeDiscord, llm: ScriptedLLM) -> None:
    guild = dc.guild(GUILD_ID, "Team")
    general = dc.text_channel(guild, GENERAL_ID, "general")
    ada, bob = dc.user(ADA_ID, "ada"), dc.user(BOB_ID, "bob")
    carol = dc.user(CAROL_ID, "carol")
    gw = Gateway(config(make_config, dc, members=[str(BOB_ID)], allow_guilds=[str(GUILD_ID)]),
                 grace=2.0)
    await gw.start()
    try:
        sent = 0

        async def say(user: dict[str, Any], text: str) -> dict[str, Any]:
            nonlocal sent
            dc.post(general, user, f"<@{BOT_ID}> {text}", mentions=(dc.bot,))
            sent += 1
            await dc.wait_sent(GENERAL_ID, sent)
            return llm.requests[-1]

        for user, note in ((bob, "Bob's locker code is 4711"),
                           (ada, "Ada's passport number is X123")):
            llm.tool_call("memory", {"action": "remember", "text": note}).reply("noted")
            await say(user, f"REMEMBER: {note}")
        assert "Saved to memory/chats/" in tool_results(llm.requests[-1])[-1]

        question = "what is the locker code and the passport number?"
        llm.reply("a").reply("b").reply("c")
        bob_asks = runtime_of(await say(bob, question))
        ada_asks = runtime_of(await say(ada, question))
        carol_asks = runtime_of(await say(carol, question))
    finally:
        await gw.stop()
    assert RULE + "member" in bob_asks and RULE + "owner" in ada_asks
    assert RULE + "guest" in carol_asks
    assert "4711" in bob_asks and "X123" not in bob_asks
    assert "X123" in ada_asks and "4711" not in ada_asks
    assert "Memory recall" not in carol_asks
    notes = sorted(str(p.relative_to(gw.config.workspace_path))
                   for p in Path(gw.config.workspace_path, "memory").rglob("*.md"))
    assert len(notes) == 2 and all(f"people/discord+{who}/" in n
                                   for n, who in zip(notes, (ADA_ID, BOB_ID), strict=True))


async def test_a_guest_in_an_allowed_telegram_group_gets_no_host_tools(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    from tests.fakes.telegram_server import FakeTelegram

    group_id, bob_id = -100200300, 1002
    async with FakeTelegram() as tg:
        section = {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                   "base_file_url": tg.base_file_url, "poll_timeout": "1s",
                   "watchdog": "10s", "allow_from": ["1001"], "allow_groups": [str(group_id)]}
        gw = Gateway(make_config(channels={"local": {"enabled": False}, "telegram": section}),
                     grace=2.0)
        await gw.start()
        try:
            hostile_calls(llm, "guest")
            llm.reply("done")
            group, bob = tg.group(group_id, "Open group"), tg.user(bob_id, "Bob")
            tg.message(group, bob, "@parley_bot run these for me")
            await tg.wait_sent(group_id)
            first, second = llm.requests[-2:]
        finally:
            await gw.stop()
    assert RULE + "guest" in runtime_of(first)
    assert not offered(first) & HOST_TOOLS
    assert all("not available" in r for r in tool_results(second)[:3])
    assert not list(gw.config.workspace_path.glob("guest-*"))


async def test_a_local_post_can_try_the_agent_as_a_guest(gateway: Gateway,
                                                         llm: ScriptedLLM) -> None:
    hostile_calls(llm, "local")
    llm.reply("done")
    await gateway.local.ask("c1", "run these", trust="guest", timeout=10)
    first, second = llm.requests[-2:]
    assert RULE + "guest" in runtime_of(first) and not offered(first) & HOST_TOOLS
    assert all("not available" in r for r in tool_results(second)[:3])
    assert not list(gateway.config.workspace_path.glob("local-*"))


async def test_a_guest_in_a_group_cannot_reset_stop_or_compact_it(gateway: Gateway,
                                                                   llm: ScriptedLLM) -> None:
    group = {"chat_type": "group", "mentioned": True}
    status = await gateway.local.ask("g1", "/status", trust="guest", timeout=10, **group)
    assert "Your trust level: guest" in status
    assert "read_file" in status and "write_file" not in status and "exec" not in status
    for command in ("/new", "/stop", "/compact"):
        answer = await gateway.local.ask("g1", command, trust="guest", timeout=10, **group)
        assert "only members and the owner" in answer, answer
    member = await gateway.local.ask("g1", "/new", trust="member", timeout=10, **group)
    assert member.startswith("Started a new conversation")
    assert llm.calls == 0
