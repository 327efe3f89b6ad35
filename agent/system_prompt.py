"""The system prompt: the workspace's bootstrap files, memory and skills as layers.

Byte-identical while the workspace is unchanged (so provider prompt caches hit): built once
per (heartbeat, owner files) and rebuilt only when a file's stat or the skills change. Each
layer is hashed once per prompt, for the snapshots (``agent/snapshots.py``).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import workspace as workspace_package
from agent.budget import TokenCounter
from agent.snapshots import text_hash
from gateway.kernel.config import Config
from gateway.kernel.frozen import frozen
from workspace.bootstrap import (
    BOOTSTRAP_FILES,
    FIRST_RUN_FILE,
    HEARTBEAT_FILE,
    MEMORY_FILE,
    OWNER_FILES,
    BootstrapLoader,
)
from workspace.skills import SkillsIndex
from workspace.watch import Watch

LAYER_SEPARATOR = "\n\n---\n\n"
BUILTIN_SKILLS = Path(workspace_package.__file__).resolve().parent / "builtin_skills"
"""Skills shipped with Parley; a workspace skill of the same name overrides one."""
CACHED = 1024
FIRST_RUN_NOTE = ("# First run (BOOTSTRAP.md)\nFollow these first-run instructions with the "
                  "owner; when they are done, delete BOOTSTRAP.md.\n\n")


@frozen
class Layer:
    name: str
    text: str
    tokens: int

    @property
    def hash(self) -> str:
        return text_hash(self.text)


@frozen
class SystemPrompt:
    text: str
    layers: tuple[Layer, ...]
    tokens: int
    notes: tuple[str, ...]
    skills: int


class SystemPrompts:
    def __init__(self, config: Config, counter: TokenCounter, *,
                 builtin_skills: Path | None = BUILTIN_SKILLS) -> None:
        ctx = config.agent.context
        self.config = config
        self.counter = counter
        self.workspace = config.workspace_path
        self.loader = BootstrapLoader(self.workspace, max_chars=ctx.bootstrap_max_chars,
                                      total_max_chars=ctx.bootstrap_total_max_chars)
        skills = config.agent.skills
        # Rising precedence: a later folder's skill replaces an earlier one of the same name.
        self.skills = SkillsIndex([*([builtin_skills] if builtin_skills else []),
                                   *skills.folders,
                                   *([skills.user_folder] if skills.user_folder else []),
                                   self.workspace / "skills"], config=config)
        # inotify where there is one: a turn over unchanged files and skills makes no stat
        self.loader.watch = self.skills.watch = Watch.open()
        fixed = (FIRST_RUN_FILE, *BOOTSTRAP_FILES, MEMORY_FILE, HEARTBEAT_FILE)
        self.extra = tuple(dict.fromkeys(f for f in ctx.bootstrap.extra_files
                                         if f not in fixed))
        self._system_cache: dict[tuple[bool, bool], tuple[Any, SystemPrompt]] = {}
        self._hashes: dict[int, tuple[SystemPrompt, list[tuple[str, str]]]] = {}
        self._chat_prompts: dict[tuple[str, str], tuple[SystemPrompt, SystemPrompt]] = {}
        """A chat's prompt → (the system prompt it was added to, the result)."""

    def _identity(self) -> str:
        return "\n".join([
            "# Runtime",
            "You are the agent behind Parley, a chat gateway: people reach you from chat "
            "channels, and your replies go back to the chat they came from.",
            f"- OS: {platform.system()} {platform.machine()}",
            f"- Python: {platform.python_version()}",
            f"- Workspace: {self.workspace} (file tools and commands work here)",
        ])

    def system_prompt(self, *, heartbeat: bool = False, owner_files: bool = True
                      ) -> SystemPrompt:
        """The system prompt; without ``owner_files`` it leaves out USER.md and MEMORY.md
        (a turn whose audience may not see the owner's facts)."""
        names = (FIRST_RUN_FILE, *BOOTSTRAP_FILES, *self.extra, MEMORY_FILE) + (
            (HEARTBEAT_FILE,) if heartbeat else ())
        if not owner_files:
            names = tuple(n for n in names if n not in (*OWNER_FILES, FIRST_RUN_FILE))
        skills = self.skills.skills()
        # The skills themselves, not their id(): ids of a freed index generation get reused.
        sig = (self.loader.signature(names), tuple(skills))
        key = (heartbeat, owner_files)
        cached = self._system_cache.get(key)
        if cached and cached[0] == sig:
            return cached[1]
        prompt = self._build_system(names, skills, heartbeat)
        self._system_cache[key] = (sig, prompt)
        return prompt

    def _build_system(self, names: tuple[str, ...], skills: list[Any],
                      heartbeat: bool) -> SystemPrompt:
        files = {f.name: f for f in self.loader.load(names)}
        notes = tuple(f"{f.name}: {f.cut}" for f in files.values() if f.cut)
        parts: list[tuple[str, str]] = [("identity", self._identity())]
        if FIRST_RUN_FILE in files and files[FIRST_RUN_FILE].text:
            parts.append((FIRST_RUN_FILE, FIRST_RUN_NOTE + files[FIRST_RUN_FILE].text))
        for name in (*BOOTSTRAP_FILES, *self.extra):
            if name in names and name in files and files[name].text:
                parts.append((name, files[name].text))
        if MEMORY_FILE in files and files[MEMORY_FILE].text:
            parts.append(("memory", files[MEMORY_FILE].text))
        always = [s for s in skills if s.always and s.available]
        if always:
            parts.append(("skills_always", "\n\n".join(
                f"# Skill: {s.name}\n\n{s.body}" for s in always)))
        listed = [s for s in skills if not (s.always and s.available)]
        if listed:
            parts.append(("skills_summary", "# Skills\nRead a skill's file with read_file "
                          "before using it.\n" + "\n".join(
                              s.summary_line(self.workspace) for s in listed)))
        if heartbeat and HEARTBEAT_FILE in files and files[HEARTBEAT_FILE].text:
            parts.append(("heartbeat", files[HEARTBEAT_FILE].text))
        layers = tuple(Layer(n, t, self.counter.count_text(t)) for n, t in parts)
        text = LAYER_SEPARATOR.join(layer.text for layer in layers)
        return SystemPrompt(text=text, layers=layers, tokens=self.counter.count_text(text) + 4,
                            notes=notes, skills=len(skills))

    def with_chat_prompt(self, system: SystemPrompt, text: str) -> SystemPrompt:
        """``system`` with a chat's own addition as its last layer (counted once per text)."""
        key = ("chat", text)
        cached = self._chat_prompts.get(key)
        if cached is None or cached[0] is not system:
            layer = Layer("chat_prompt", f"# This chat\n{text}",
                          self.counter.count_text(f"# This chat\n{text}"))
            joined = system.text + LAYER_SEPARATOR + layer.text
            cached = self._chat_prompts[key] = (system, SystemPrompt(
                text=joined, layers=(*system.layers, layer),
                tokens=self.counter.count_text(joined) + 4, notes=system.notes,
                skills=system.skills))
        return cached[1]

    def layer_hashes(self, system: SystemPrompt) -> list[tuple[str, str]]:
        """(name, hash) of each layer, hashed once per system prompt."""
        found = self._hashes.get(id(system))
        if found is None or found[0] is not system:
            if len(self._hashes) >= CACHED:
                self._hashes.clear()
            found = self._hashes[id(system)] = (
                system, [(layer.name, layer.hash) for layer in system.layers])
        return found[1]

