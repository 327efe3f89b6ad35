"""What one turn's speaker may see and do: tools, the owner's files, and whose memory.

The channel that took a message in decided how far its sender is trusted
(``InboundMessage.trust``: owner, member or guest). ``TrustPolicy.audience`` turns that, with
``agent.trust`` and the chat, into an ``Audience`` once per turn:

- **tools**: a ``ToolFilter`` of the level's list (per chat when configured). The registry offers
  the model only the tools it allows and refuses a call to any other by name, so a prompt
  injection cannot widen a guest's tools by naming one;
- **owner files**: whether ``MEMORY.md``, ``USER.md`` and the owner's home memory reach this
  turn (``agent.trust.owner_files``: the owner's direct chats by default);
- **memory**: which scopes the turn recalls from and the memory tool writes to. A person's notes
  stay with that person (``channel:sender_id``) and, said in a group, with that group too; a
  group's own notes (left by compaction) are recalled in that group only. Nothing one person
  said reaches another person's context unless the owner shared it.

Several messages answered in one turn take the least trusted sender's level
(``agent/queueing.py``), and a less trusted message never steers a running turn.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase
from functools import lru_cache

from gateway.kernel.config import LevelConfig, TrustConfig
from gateway.kernel.events import InboundMessage, Trust
from gateway.kernel.frozen import frozen
from workspace.memory import HOME, MemoryScope, chat_scope, person_scope


@frozen
class ToolFilter:
    """The tools one level may use in one chat: names and shell-style patterns."""

    patterns: tuple[str, ...]

    def allows(self, name: str) -> bool:
        return _allows(self.patterns, name)


@lru_cache(maxsize=8192)
def _allows(patterns: tuple[str, ...], name: str) -> bool:
    """Asked for every tool on every turn; the answers never change."""
    return any(fnmatchcase(name, p) for p in patterns)


ALL_TOOLS = ToolFilter(("*",))
MEMORY_ONLY = ToolFilter(("memory",))


@frozen
class Audience:
    """Decided once per turn from its message (``TrustPolicy.audience``)."""

    trust: Trust
    tools: ToolFilter
    owner_files: bool
    """MEMORY.md, USER.md and the owner's home memory are part of this turn."""
    recall: tuple[MemoryScope, ...]
    """The memory scopes recalled into the turn and searched by the memory tool."""
    notes: MemoryScope
    """Where the memory tool writes a log entry (and a fact, unless ``facts`` says otherwise)."""
    facts: MemoryScope
    """Where the memory tool writes a lasting fact."""
    group_notes: MemoryScope | None = None
    """A group's own scope: where compaction's memory flush writes in a group."""

    def for_flush(self) -> Audience:
        """The audience of compaction's silent memory flush (the memory tool only): in a
        group it writes the group's own notes, not the last speaker's."""
        flush = replace(self, tools=MEMORY_ONLY)
        if self.group_notes is None:
            return flush
        return replace(flush, notes=self.group_notes, facts=self.group_notes)


class TrustPolicy:
    def __init__(self, config: TrustConfig | None = None) -> None:
        self.config = config or TrustConfig()
        self._filters: dict[tuple[Trust, str], ToolFilter] = {}

    def tools(self, trust: Trust, chat: str) -> ToolFilter:
        """The tool filter of ``trust`` in ``chat`` (``channel:chat_id``), built once."""
        key = (trust, chat)
        found = self._filters.get(key)
        if found is None:
            level: LevelConfig = getattr(self.config, trust)
            per_chat = self.config.chats.get(chat)
            if per_chat is not None and getattr(per_chat, trust) is not None:
                level = getattr(per_chat, trust)
            found = ToolFilter(tuple(level.tools))
            if len(self._filters) < 4096:  # the configured chats, plus a bounded rest
                self._filters[key] = found
        return found

    def owner_files(self, msg: InboundMessage) -> bool:
        where = self.config.owner_files
        if where == "everyone":
            return True
        return msg.trust == "owner" and (where == "owner" or msg.chat_type == "direct")

    def audience(self, msg: InboundMessage) -> Audience:
        chat = f"{msg.channel}:{msg.chat_id}"
        person = f"{msg.channel}:{msg.sender_id}"
        owner_files = self.owner_files(msg)
        if msg.chat_type == "group":
            group: MemoryScope | None = chat_scope(chat)
            own = person_scope(person, chat)
            recall: tuple[MemoryScope, ...] = (group, own) if group else (own,)
        else:
            group, own = None, person_scope(person)
            recall = (own,)
        if owner_files:
            recall = (HOME, *recall)
        facts = HOME if owner_files and msg.trust == "owner" else own
        return Audience(trust=msg.trust, tools=self.tools(msg.trust, chat),
                        owner_files=owner_files, recall=recall, notes=own, facts=facts,
                        group_notes=group)


DEFAULT_POLICY = TrustPolicy()
