"""The ``agent.trust:`` section: what each trust level may do (``agent/trust.py`` applies it).

A level's ``tools`` lists tool names, with shell-style patterns (``mcp_*``, ``*``). A tool not
listed is neither offered to the model nor run for that level, whatever the model asks. Per chat
(``channel:chat_id``) a level can be given another list. The defaults keep strangers away from
the host, the owner's files and other people's memory: guests may read the workspace's public
files, fetch and search the web and answer in their own chat; members may also keep their own
memory; the owner may do everything.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from gateway.kernel.config_fields import Section

GUEST_TOOLS = ("read_file", "list_dir", "web_fetch", "web_search", "message")
MEMBER_TOOLS = (*GUEST_TOOLS, "memory", "session_search")
OWNER_TOOLS = ("*",)
_TOOL_PATTERN = re.compile(r"^[A-Za-z0-9_*?-]{1,64}$")


def check_tool_names(names: list[str]) -> list[str]:
    for i, name in enumerate(names):
        if not _TOOL_PATTERN.match(name):
            raise ValueError(f"[{i}] {name!r} is not a tool name or pattern (letters, digits, "
                             "_, - and the wildcards * and ?)")
    return names


class LevelConfig(Section):
    tools: list[str]
    """Tool names or patterns this level may use; [] for none."""

    @field_validator("tools")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        return check_tool_names(names)


class ChatTrustConfig(Section):
    """Another tool list for one chat; an unset level keeps the global list."""

    owner: LevelConfig | None = None
    member: LevelConfig | None = None
    guest: LevelConfig | None = None


class TrustConfig(Section):
    owner: LevelConfig = LevelConfig(tools=list(OWNER_TOOLS))
    member: LevelConfig = LevelConfig(tools=list(MEMBER_TOOLS))
    guest: LevelConfig = LevelConfig(tools=list(GUEST_TOOLS))
    chats: dict[str, ChatTrustConfig] = Field(default_factory=dict)
    """``channel:chat_id`` → tool lists for that chat (a Discord channel, a Telegram group)."""
    owner_files: Literal["direct", "owner", "everyone"] = "direct"
    """Where MEMORY.md, USER.md and the owner's older daily logs reach: ``direct`` (the
    owner's private chats), ``owner`` (any turn where the owner speaks, groups included) or
    ``everyone`` (every session: only for a bot that serves its owner alone)."""

    @field_validator("chats")
    @classmethod
    def _chat_keys(cls, chats: dict[str, ChatTrustConfig]) -> dict[str, ChatTrustConfig]:
        for key in chats:
            channel, _, chat_id = key.partition(":")
            if not channel or not chat_id:
                raise ValueError(f"{key!r} is not a chat: write channel:chat_id "
                                 "(e.g. discord:123456789)")
        return chats
