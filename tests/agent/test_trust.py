"""The trust policy: which tools a level gets (per chat), whether the owner's files reach a
turn, whose memory it reads and writes; and the places that must never widen trust (a
refused call by name, merged turns, steering)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.budget import TokenCounter
from agent.context import ContextBuilder
from agent.lanes import Lane
from agent.queueing import Work, fold, merge
from agent.tools import build_registry
from agent.tools.base import ToolRegistry, tool
from agent.trust import TrustPolicy
from agent.turn import TurnContext
from gateway.kernel.config import ToolsConfig, TrustConfig, parse_config
from gateway.kernel.events import InboundMessage
from gateway.kernel.values import ChannelHints
from tests.agent.tools.conftest import EXEC_FOR_LISTS
from tests.conftest import offered_tools
from workspace.memory import HOME

NOW = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)


def msg(trust: str = "guest", *, chat_type: str = "direct", sender: str = "u1",
        chat: str = "c1", text: str = "hi", **extra: Any) -> InboundMessage:
    return InboundMessage(channel="discord", chat_id=chat, sender_id=sender, text=text,
                          trust=trust, chat_type=chat_type,  # type: ignore[arg-type]
                          received_at=NOW, **extra)


def tool_names(policy: TrustPolicy, message: InboundMessage) -> set[str]:
    registry = build_registry(ToolsConfig(), exec_access=EXEC_FOR_LISTS)
    allowed = policy.audience(message).tools
    return offered_tools({"tools": registry.schemas(allowed)})


def test_default_levels() -> None:
    policy = TrustPolicy()
    host = {"exec", "write_file", "edit_file", "cron", "spawn"}
    assert tool_names(policy, msg("owner")) >= host
    for level in ("member", "guest"):
        names = tool_names(policy, msg(level))
        assert not names & host and {"read_file", "list_dir", "message"} <= names
    assert policy.tools("member", "discord:c1").allows("memory")
    assert not policy.tools("guest", "discord:c1").allows("memory")
    assert not policy.tools("guest", "discord:c1").allows("mcp_github_create_issue")
    assert policy.tools("owner", "discord:c1").allows("mcp_github_create_issue")


def test_levels_per_chat_and_patterns() -> None:
    config = TrustConfig.model_validate({
        "guest": {"tools": ["read_file", "mcp_docs_*"]},
        "chats": {"discord:lab": {"guest": {"tools": []}, "member": {"tools": ["exec"]}}}})
    policy = TrustPolicy(config)
    assert policy.tools("guest", "discord:c1").allows("mcp_docs_search")
    assert not policy.tools("guest", "discord:c1").allows("mcp_mail_send")
    assert not policy.tools("guest", "discord:lab").allows("read_file")
    assert policy.tools("member", "discord:lab").allows("exec")
    assert not policy.tools("member", "discord:c1").allows("exec")  # only in that chat


def test_bad_trust_config_names_the_key() -> None:
    for bad, where in (({"chats": {"nochat": {}}}, "agent.trust.chats"),
                       ({"guest": {"tools": ["rm -rf"]}}, "agent.trust.guest.tools")):
        try:
            parse_config({"agent": {"trust": bad}}, env={})
        except Exception as exc:  # ConfigError
            assert where in str(exc), exc
        else:
            raise AssertionError(f"{bad} was accepted")


async def test_a_refused_tool_is_not_run_whatever_the_model_says(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool(name="exec")
    async def fake_exec(ctx: TurnContext, command: str) -> str:
        """Run it.

        Args:
            command: what.
        """
        ran.append(command)
        return "ran"

    registry = ToolRegistry([fake_exec])
    for trust, expect_run in (("guest", False), ("member", False), ("owner", True)):
        ctx = TurnContext(message=msg(trust), session_id=1, workspace=tmp_path)
        result = await registry.execute("exec", {"command": "id"}, ctx)
        assert result.is_error is not expect_run, result
        if not expect_run:
            assert "not available in this conversation" in result.text
        assert registry.schemas(ctx.access.tools) == ([fake_exec.schema()] if expect_run else [])
    assert ran == ["id"]


def test_owner_files_reach_only_where_configured() -> None:
    direct, in_group = msg("owner"), msg("owner", chat_type="group")
    default = TrustPolicy()
    assert default.audience(direct).owner_files
    assert not default.audience(in_group).owner_files
    assert not default.audience(msg("member")).owner_files
    owner_anywhere = TrustPolicy(TrustConfig(owner_files="owner"))
    assert owner_anywhere.audience(in_group).owner_files
    assert not owner_anywhere.audience(msg("guest", chat_type="group")).owner_files
    assert TrustPolicy(TrustConfig(owner_files="everyone")).audience(msg("guest")).owner_files


def test_memory_scopes() -> None:
    policy = TrustPolicy()
    owner = policy.audience(msg("owner", sender="ada"))
    assert owner.recall[0] == HOME and owner.facts == HOME
    assert owner.notes.logs == "memory/people/discord+ada"
    bob = policy.audience(msg("member", sender="bob"))
    assert HOME not in bob.recall and bob.facts == bob.notes
    in_group = policy.audience(msg("member", sender="bob", chat_type="group", chat="g1"))
    assert [s.logs for s in in_group.recall] == ["memory/chats/discord+g1",
                                                 "memory/chats/discord+g1/people/discord+bob"]
    assert in_group.notes.logs.endswith("people/discord+bob")
    assert in_group.for_flush().notes.logs == "memory/chats/discord+g1"  # the group's own
    assert in_group.for_flush().tools.allows("memory")
    assert not in_group.for_flush().tools.allows("exec")


def test_the_system_prompt_leaves_the_owner_files_out(tmp_path: Path) -> None:
    config = parse_config({"workspace": str(tmp_path),
                           "agent": {"context": {"max_context_tokens": 8000}}}, env={})
    (tmp_path / "USER.md").write_text("The owner likes tea.")
    (tmp_path / "MEMORY.md").write_text("- The owner's bank is Acme.")
    (tmp_path / "SOUL.md").write_text("Be kind.")
    builder = ContextBuilder(config, TokenCounter("openai/gpt-4o-mini"), builtin_skills=None)
    hints = ChannelHints()
    for trust, shown in (("owner", True), ("member", False), ("guest", False)):
        system = builder.build(inbound=msg(trust), history=[], hints=hints).messages[0]["content"]
        assert "Be kind." in system
        assert ("likes tea" in system) is shown and ("Acme" in system) is shown


def test_merged_and_folded_turns_take_the_least_trusted_level() -> None:
    works = [Work(msg("owner", chat_type="group", text="a")),
             Work(msg("guest", chat_type="group", sender="mallory", text="run rm -rf")),
             Work(msg("owner", chat_type="group", text="c"))]
    assert merge(works).msg.trust == "guest"
    assert merge([works[0], works[2]]).msg.trust == "owner"
    assert fold(works, 2)[0].msg.trust == "guest"


def test_a_less_trusted_message_never_steers_a_running_turn() -> None:
    lane = Lane(waiting=[Work(msg("owner", text="also this")),
                         Work(msg("guest", sender="mallory", text="now delete everything")),
                         Work(msg("owner", text="later"))])
    taken = lane.take_arrived("owner")
    assert [w.msg.text for w in taken] == ["also this"]
    assert [w.msg.text for w in lane.waiting] == ["now delete everything", "later"]
    assert [w.msg.text for w in lane.take_arrived("guest")] == ["now delete everything",
                                                                "later"]


async def test_others_reach_only_the_public_folders_of_the_workspace(tmp_path: Path) -> None:
    for rel, text in (("skills/w/SKILL.md", "use curl"), ("shared/menu.md", "soup"),
                      ("taxes-2026.txt", "income"), ("memory/people/x/2026-01-01.md", "pin"),
                      ("MEMORY.md", "owner facts")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    registry = build_registry(ToolsConfig())

    async def read(trust: str, path: str) -> str:
        ctx = TurnContext(message=msg(trust), session_id=1, workspace=tmp_path)
        return (await registry.execute("read_file", {"path": path}, ctx)).text

    for trust in ("guest", "member"):
        assert "use curl" in await read(trust, "skills/w/SKILL.md")
        assert "soup" in await read(trust, "shared/menu.md")
        for private in ("taxes-2026.txt", "MEMORY.md", "memory/people/x/2026-01-01.md",
                        "shared/../taxes-2026.txt", "skills/../MEMORY.md"):
            assert "private to the owner" in await read(trust, private), private
        ctx = TurnContext(message=msg(trust), session_id=1, workspace=tmp_path)
        listing = await registry.execute("list_dir", {"path": "."}, ctx)
        assert listing.is_error and "taxes" not in listing.text
    assert "income" in await read("owner", "taxes-2026.txt")


async def test_a_person_reads_their_own_chats_inbox_and_no_other(tmp_path: Path) -> None:
    """Files sent in a chat are readable by that chat's turns; another chat's, or another
    channel's folder of the same chat id, stay private."""
    for rel, text in (("inbox/discord/c1/voice.txt", "mine"),
                      ("inbox/discord/c2/contract.txt", "theirs"),
                      ("inbox/telegram/c1/x.txt", "elsewhere")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    registry = build_registry(ToolsConfig())

    async def read(trust: str, chat: str, path: str) -> str:
        ctx = TurnContext(message=msg(trust, chat=chat), session_id=1, workspace=tmp_path)
        return (await registry.execute("read_file", {"path": path}, ctx)).text

    for trust in ("guest", "member"):
        assert "mine" in await read(trust, "c1", "inbox/discord/c1/voice.txt")
        for other in ("inbox/discord/c2/contract.txt", "inbox/telegram/c1/x.txt",
                      "inbox/discord/c1/../c2/contract.txt", "inbox/discord"):
            refused = await read(trust, "c1", other)
            assert "private to the owner" in refused and "theirs" not in refused, other
        assert "theirs" in await read(trust, "c2", "inbox/discord/c2/contract.txt")
    assert "theirs" in await read("owner", "c1", "inbox/discord/c2/contract.txt")
