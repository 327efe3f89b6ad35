"""The workspace's bootstrap files, read with per-file and total size limits.

A cut is never silent: the text keeps a marker, the log gets a warning, and the cut is
reported so the turn's snapshot can say so. Files are re-read only when their mtime or size
changes.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from importlib import resources
from pathlib import Path

from gateway.kernel.frozen import frozen
from workspace.watch import Watch

Signature = tuple[tuple[int, int] | None, ...]

_log = logging.getLogger(__name__)

BOOTSTRAP_FILES = ("SOUL.md", "IDENTITY.md", "AGENTS.md", "USER.md", "TOOLS.md")
MEMORY_FILE = "MEMORY.md"
USER_FILE = "USER.md"
OWNER_FILES = (USER_FILE, MEMORY_FILE)
"""About the owner: in the prompt only where ``agent.trust.owner_files`` lets them reach."""
HEARTBEAT_FILE = "HEARTBEAT.md"
FIRST_RUN_FILE = "BOOTSTRAP.md"
"""First-run instructions (OpenClaw's ritual): in the owner's prompt while the file exists;
the agent deletes it when done."""
HEAD_SHARE = 0.7
TAIL_SHARE = 0.2


@frozen
class FileText:
    name: str
    text: str
    chars: int
    """The file's length before any cut."""
    cut: str | None = None
    """Why and how much was cut, or None."""


def cut_middle(text: str, max_chars: int, label: str) -> tuple[str, bool]:
    """Keep 70 % head and 20 % tail of ``text`` around a visible marker."""
    if len(text) <= max_chars:
        return text, False
    head = text[: int(max_chars * HEAD_SHARE)]
    tail = text[len(text) - int(max_chars * TAIL_SHARE):]
    removed = len(text) - len(head) - len(tail)
    marker = (f"\n\n[… {removed:,} characters of {label} cut here to fit the "
              f"{max_chars:,}-character limit …]\n\n")
    return head + marker + tail, True


class BootstrapLoader:
    def __init__(self, workspace: Path, *, max_chars: int, total_max_chars: int) -> None:
        self.workspace = workspace
        self.max_chars = max_chars
        self.total_max_chars = total_max_chars
        self._cache: dict[str, tuple[tuple[int, int], str]] = {}
        self.watch: Watch | None = None
        """Set by the owner: then an unchanged workspace costs no ``stat`` (``signature``)."""
        self._signatures: dict[tuple[str, ...], tuple[int, Signature]] = {}

    def _read(self, name: str) -> str | None:
        path = self.workspace / name
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            self._cache.pop(name, None)
            return None
        sig = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(name)
        if cached and cached[0] == sig:
            return cached[1]
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except (IsADirectoryError, PermissionError) as exc:
            _log.warning("cannot read %s: %s", path, exc)
            return None
        self._cache[name] = (sig, text)
        return text

    def signature(self, names: tuple[str, ...]) -> Signature:
        """A cheap fingerprint of the files (stat only), for callers that cache their output;
        with a ``watch``, the last one again while nothing in their folders changed."""
        watch = self.watch
        generation = watch.look() if watch is not None else None
        if generation is not None:
            known = self._signatures.get(names)
            if known is not None and known[0] == generation:
                return known[1]
        paths = [self.workspace / name for name in names]
        trusted = watch is not None and watch.cover(sorted({p.parent for p in paths}))
        out: list[tuple[int, int] | None] = []
        for path in paths:
            try:
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):  # a change to its target is seen nowhere here
                    trusted = False
                    st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        sig = tuple(out)
        if trusted and generation is not None:
            if len(self._signatures) > 16:
                self._signatures.clear()
            self._signatures[names] = (generation, sig)
        return sig

    def load(self, names: tuple[str, ...]) -> list[FileText]:
        """The files that exist, in order, each within the limits; empty files are skipped."""
        out: list[FileText] = []
        budget = self.total_max_chars
        for name in names:
            raw = self._read(name)
            if not raw:
                continue
            text, cut = cut_middle(raw, self.max_chars, name)
            reason = f"cut from {len(raw):,} to {self.max_chars:,} characters" if cut else None
            if len(text) > budget:
                if budget < 200:
                    reason = (f"left out: the bootstrap total limit of "
                              f"{self.total_max_chars:,} characters was reached")
                    _log.warning("%s %s", name, reason)
                    out.append(FileText(name, "", len(raw), reason))
                    continue
                # Cut the raw text, not the already cut one: one marker with the true count.
                text, _ = cut_middle(raw, budget, name)
                reason = (f"cut from {len(raw):,} to {budget:,} characters "
                          f"(bootstrap total limit {self.total_max_chars:,})")
            if reason:
                _log.warning("bootstrap file %s %s", name, reason)
            budget -= len(text)
            out.append(FileText(name, text, len(raw), reason))
        return out


def seed_workspace(workspace: Path, *, overwrite: bool = False) -> list[Path]:
    """Copy the templates into ``workspace``, keeping files the user already has."""
    written: list[Path] = []
    workspace.mkdir(parents=True, exist_ok=True)
    root = resources.files("workspace") / "templates"
    with resources.as_file(root) as src:
        for item in sorted(Path(src).rglob("*")):
            if not item.is_file() or item.name.startswith(("_", ".")) or item.suffix != ".md":
                continue
            target = workspace / item.relative_to(src)
            if target.exists() and not overwrite:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item, target)
            written.append(target)
    return written
