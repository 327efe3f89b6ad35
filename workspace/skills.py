"""Skills: ``skills/<name>/SKILL.md`` with YAML frontmatter.

Always-on skills go into the system prompt in full; the others appear as a one-line summary
that the agent opens with ``read_file`` when it needs one. The index is rebuilt only when a
SKILL.md file (or the set of skill folders) changes.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.kernel.frozen import frozen
from workspace.watch import Watch

_log = logging.getLogger(__name__)


@frozen
class Skill:
    name: str
    description: str
    path: Path
    always: bool
    available: bool
    reason: str | None
    body: str
    tools: tuple[str, ...] = ()
    """Tools an always-on skill uses: offered in full from the start (``tools:``)."""

    def summary_line(self, workspace: Path) -> str:
        try:
            shown = self.path.relative_to(workspace)
        except ValueError:
            shown = self.path
        state = "available" if self.available else f"unavailable: {self.reason}"
        return f"- {self.name}: {self.description} (path: {shown}; {state})"


def parse_skill(path: Path, text: str) -> tuple[dict[str, Any], str]:
    """Split ``---`` YAML frontmatter from the body; a bad frontmatter is an empty one."""
    if text.startswith("---"):
        end = text.find("\n---", 3)
        if end != -1:
            try:
                meta = yaml.safe_load(text[3:end]) or {}
            except yaml.YAMLError as exc:
                _log.warning("skill %s: frontmatter is not valid YAML: %s", path, exc)
                meta = {}
            if isinstance(meta, dict):
                return meta, text[end + 4:].strip()
    return {}, text.strip()


def _names(value: Any) -> list[str]:
    """``bins: git`` means one command, not the letters g, i and t."""
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def config_value(config: Any, key: str) -> Any:
    """The value at a dotted config path (``agent.tools.web.search.provider``), else None."""
    node = config
    for part in key.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _set(value: Any) -> bool:
    """A config key counts as set when it holds something other than off, empty or none."""
    return value not in (None, False, "", "none", 0) and value != []


def this_os() -> set[str]:
    system = platform.system().lower()
    return {system, sys.platform, {"darwin": "macos"}.get(system, system)}


def _availability(meta: dict[str, Any], config: Any = None) -> tuple[bool, str | None]:
    """``requires``: ``bins`` (commands on PATH), ``env`` (variables), ``config`` (dotted
    keys of the gateway's config that must be set) and ``os`` (any of linux, darwin/macos,
    windows/win32)."""
    requires = meta.get("requires") or {}
    if not isinstance(requires, dict):
        return True, None
    missing = [f"command {b}" for b in _names(requires.get("bins")) if not shutil.which(b)]
    missing += [f"env {e}" for e in _names(requires.get("env")) if not os.environ.get(e)]
    missing += [f"config {k}" for k in _names(requires.get("config"))
                if not _set(config_value(config, k))]
    wanted = {o.lower() for o in _names(requires.get("os"))}
    if wanted and not wanted & this_os():
        missing.append(f"os {' or '.join(sorted(wanted))} (this is {platform.system()})")
    return (False, "missing " + ", ".join(missing)) if missing else (True, None)


class SkillsIndex:
    def __init__(self, folders: list[Path], *, config: Any = None) -> None:
        """``folders`` in rising priority: a later folder's skill overrides an earlier one.
        ``config``: the gateway's, for ``requires: {config: [...]}``."""
        self.folders = folders
        self.config = config
        self._sig: tuple[Any, ...] | None = None
        self._skills: list[Skill] = []
        self.watch: Watch | None = None
        """Set by the owner: then unchanged skill folders cost no ``scandir``/``stat``."""
        self._seen: int | None = None
        """The watch's generation when the folders were last looked at (None: look again)."""

    def _signature(self) -> tuple[tuple[Any, ...], bool]:
        """(the skills' paths and SKILL.md stats, whether the watch covers every one)."""
        watch = self.watch
        trusted = watch is not None and watch.cover(self.folders)
        sig: list[Any] = []
        for folder in self.folders:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                skill_md = os.path.join(entry.path, "SKILL.md")
                try:
                    if entry.is_symlink() or os.path.islink(skill_md):
                        trusted = False  # a change at the link's target is not seen here
                    elif trusted and entry.is_dir():
                        trusted = watch is not None and watch.cover([Path(entry.path)])
                    st = os.stat(skill_md)
                except OSError:
                    continue
                sig.append((entry.path, st.st_mtime_ns, st.st_size))
        return tuple(sig), trusted

    def skills(self) -> list[Skill]:
        generation = self.watch.look() if self.watch is not None else None
        if generation is not None and generation == self._seen:
            return self._skills
        sig, trusted = self._signature()
        if sig != self._sig:
            self._skills = self._scan(sig)
            self._sig = sig
        self._seen = generation if trusted else None
        return self._skills

    def _scan(self, sig: tuple[Any, ...]) -> list[Skill]:
        found: dict[str, Skill] = {}
        for folder_path, _, _ in sig:
            path = Path(folder_path) / "SKILL.md"
            try:
                meta, body = parse_skill(path, path.read_text(encoding="utf-8", errors="replace"))
            except OSError as exc:
                _log.warning("cannot read skill %s: %s", path, exc)
                continue
            name = str(meta.get("name") or Path(folder_path).name)
            available, reason = _availability(meta, self.config)
            found[name] = Skill(name=name, description=str(meta.get("description") or "").strip(),
                                path=path, always=bool(meta.get("always")),
                                available=available, reason=reason, body=body,
                                tools=tuple(_names(meta.get("tools"))))
        return sorted(found.values(), key=lambda s: s.name)
