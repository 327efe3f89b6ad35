"""Memory: lasting facts in ``MEMORY.md``, daily logs in ``memory/YYYY-MM-DD.md``, FTS5 recall.

``MEMORY.md`` is a system-prompt layer, sent whole with every request, so it holds a few lasting
facts and is capped (``max_memory_chars``): past the cap the model is told to consolidate it,
never to let it grow. The daily logs hold everything else; they never go into the prompt whole,
only as recall: the paragraphs that best match the user's message, within a token cap.

Search ranks paragraphs (blank-line separated; a heading sticks to the paragraph after it; long
paragraphs are split) with SQLite FTS5's bm25, the same index as the conversation search
(trigram tokenizer, so CJK matches): one in-memory table per store, offline and deterministic,
the same files and query give the same hits in the same order. A file is parsed and indexed
once per version (inode, mtime, size), so a turn over unchanged memory costs a few ``stat`` calls
and one query (``memory_index``). Writes append under a lock and replace the file atomically.

Memory is kept per *scope* (``MemoryScope``): the owner's home (``MEMORY.md`` and
``memory/*.md``, the layout from before scopes), one person's own notes
(``memory/people/<who>/``), one group's (``memory/chats/<chat>/``) and one person's notes in a
group (``memory/chats/<chat>/people/<who>/``). A scope's facts are ``MEMORY.md`` in its folder.
Which scopes a turn reads and writes is decided by ``agent/trust.py``; a store only ever sees
its own scope's files, so nobody's notes reach another scope by accident.

The paragraphs and recall lines are in ``memory_search``, the FTS5 table in ``memory_index``,
the write mechanics (atomic replace, locks, duplicate keys) in ``memory_files``; the names
other modules import from here (``split_paragraphs``, ``tokenize``, ...) are re-exported.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

from gateway.kernel.config import MemoryConfig
from gateway.kernel.frozen import frozen
from gateway.kernel.fts import cjk_grams
from workspace.bootstrap import MEMORY_FILE
from workspace.memory_files import (
    across_processes,
    atomic_write,
    clean_entry,
    entry_key,
    entry_keys,
    write_lock_for,
)
from workspace.memory_index import MAX_QUERY_TERMS, Doc, MemoryIndex, Signature
from workspace.memory_search import (
    MAX_CHUNK_CHARS,
    TextCounter,
    cut_to_fit,
    one_line,
    parse_docs,
    split_paragraphs,
    tokenize,
)
from workspace.watch import Watch

__all__ = [
    "FULL_RESCAN_SECONDS", "HOME", "LOG_DIR", "MAX_CHUNK_CHARS", "MAX_ENTRY_CHARS",
    "MAX_QUERY_TERMS", "RECALL_HEADER", "RECENT_LOGS", "Hit", "MemoryKind", "MemoryRefused",
    "MemoryScope", "MemoryStore", "Saved", "Signature", "Sources", "TextCounter", "chat_scope",
    "memory_store_for", "person_scope", "recall_block", "split_paragraphs", "tokenize",
]

_log = logging.getLogger(__name__)

MemoryKind = Literal["fact", "log"]
Sources = Literal["logs", "all"]
LOG_DIR = "memory"
RECENT_LOGS = 3
"""Daily logs looked at on every turn (today's, and yesterday's across midnight and zones)."""
FULL_RESCAN_SECONDS = 60.0
RECALL_HEADER = "Memory recall (may be relevant):"
MAX_ENTRY_CHARS = 2000

MAX_STORES = 256
"""Scopes whose index stays in memory; the least recently used beyond are rebuilt on use."""


@frozen
class MemoryScope:
    """Whose notes: ``facts`` (a file, relative to the workspace) and ``logs`` (a folder of
    daily logs) of one owner, person, group, or person in a group."""

    name: str
    facts: str
    logs: str
    facts_in_prompt: bool = False
    """The facts file is a system-prompt layer already (the owner's MEMORY.md): recall
    searches only the logs then (unless ``recall_sources: all``)."""


HOME = MemoryScope("owner", MEMORY_FILE, "memory", facts_in_prompt=True)
"""The owner's memory: the workspace's MEMORY.md and the daily logs in ``memory/``."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def _slug(key: str) -> str:
    """A folder name for ``channel:id``: readable, and one name per key (a hash is added
    whenever characters had to be replaced, so two keys never share a folder)."""
    safe = _UNSAFE.sub("_", key.replace(":", "+", 1)).strip(".") or "_"
    if safe.replace("+", ":", 1) != key or len(safe) > 80:
        safe = f"{safe[:60]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    return safe


def person_scope(person: str, chat: str | None = None) -> MemoryScope:
    """One person's notes (``channel:sender_id``): their own, or those said in group ``chat``
    (``channel:chat_id``), which are recalled only there."""
    base = f"{LOG_DIR}/people/{_slug(person)}" if chat is None else \
        f"{LOG_DIR}/chats/{_slug(chat)}/people/{_slug(person)}"
    return MemoryScope(f"{person} in {chat}" if chat else person, f"{base}/{MEMORY_FILE}", base)


def chat_scope(chat: str) -> MemoryScope:
    """A group's own notes (what its conversation left behind), recalled in that group only."""
    base = f"{LOG_DIR}/chats/{_slug(chat)}"
    return MemoryScope(chat, f"{base}/{MEMORY_FILE}", base)


class MemoryRefused(ValueError):
    """A write the model should rethink (empty, too long, MEMORY.md full); the text says how."""


@frozen
class Hit:
    path: str
    """Relative to the workspace, with ``/``: ``MEMORY.md``, ``memory/2026-11-20.md``."""
    text: str
    score: float
    line: int
    """1-based line of the file where the paragraph starts."""


@frozen
class Saved:
    path: str
    written: bool
    """False when the same text was already there (nothing was written)."""


_STORES: OrderedDict[tuple[Path, MemoryConfig, str, MemoryScope], MemoryStore] = OrderedDict()
_GLOBAL = threading.Lock()


class MemoryStore:
    """The memory files of one scope of a workspace. Thread-safe; the tools call it through a
    thread."""

    def __init__(self, workspace: Path, config: MemoryConfig | None = None, *,
                 timezone: str = "UTC", clock: Callable[[], float] = time.monotonic,
                 scope: MemoryScope = HOME) -> None:
        self.workspace = workspace
        self.scope = scope
        self.config = config or MemoryConfig()
        self.tz = ZoneInfo(timezone)
        self._clock = clock
        self._listing: tuple[Signature, float, list[tuple[str, Path, Signature]]] | None = None
        """The daily logs as last listed: (folder signature, when, entries sorted by name)."""
        self._listings = 0
        """Full listings so far: a new one may have found any log changed."""
        self._write_lock = write_lock_for(workspace.expanduser().resolve())
        self._index_lock = threading.Lock()
        self.index = MemoryIndex()
        self._synced_at: int | None = None
        """The watch's generation when the index last matched the files (None: scan)."""

    # writing ------------------------------------------------------------------------------

    def remember(self, text: str, *, kind: MemoryKind = "fact", when: datetime) -> Saved:
        """Append ``text`` as one paragraph: a fact to MEMORY.md, a log entry to the daily log
        of ``when``'s date in the configured timezone (stamped with its time). An entry already
        in that file is not written twice."""
        if when.tzinfo is None:
            raise ValueError("when must be timezone-aware")
        body = clean_entry(text)
        if not body:
            raise MemoryRefused("text is empty; say what to remember")
        if len(body) > MAX_ENTRY_CHARS:
            raise MemoryRefused(f"text is {len(body):,} characters; keep one memory under "
                                f"{MAX_ENTRY_CHARS:,}: save the gist, or split it into notes")
        if kind == "fact":
            lines = body.splitlines()
            entry = "\n".join([f"- {lines[0]}", *(f"  {line}" for line in lines[1:])])
            return self._append(self.scope.facts, "Memory", entry,
                                limit=self.config.max_memory_chars)
        if not self.config.daily_log:
            raise MemoryRefused("daily logs are turned off (agent.memory.daily_log); "
                                "save lasting facts with kind=fact")
        local = when.astimezone(self.tz)
        day = f"{local:%Y-%m-%d}"
        return self._append(f"{self.scope.logs}/{day}.md", day, f"[{local:%H:%M}] {body}")

    def _append(self, rel: str, title: str, entry: str, *, limit: int | None = None) -> Saved:
        path = self.workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._write_lock, across_processes(self.workspace):
            try:
                raw: bytes | None = path.read_bytes()
            except FileNotFoundError:
                raw = None
            current = raw.decode("utf-8", errors="replace") if raw is not None else ""
            if entry_key(entry) in entry_keys(current):
                return Saved(rel, False)
            if raw is None:
                addition = f"# {title}\n\n{entry}\n"
            else:
                sep = "" if current.endswith("\n\n") or not current else \
                    "\n" if current.endswith("\n") else "\n\n"
                addition = f"{sep}{entry}\n"
            if limit is not None and len(current) + len(addition) > limit:
                raise MemoryRefused(
                    f"{rel} is full: {len(current):,} characters, and this would pass its "
                    f"{limit:,}-character limit (agent.memory.max_memory_chars). It is sent "
                    f"with every request, so do not grow it: rewrite {rel} shorter (merge "
                    "related facts, drop outdated ones) and save again, or save this with "
                    "kind=log instead")
            atomic_write(path, (raw or b"") + addition.encode("utf-8"))
        with self._index_lock:
            self.index.forget(rel)
        _log.info("memory: saved %d characters to %s", len(entry), rel)
        return Saved(rel, True)

    # index --------------------------------------------------------------------------------

    def _sync_index(self) -> None:
        """The index brought up to the files, with no ``stat`` at all while inotify says
        nothing changed in the facts' folder or the logs' (``workspace/watch.py``; symlinked
        folders, or no inotify: ``_scan`` every time, as before). Under ``_index_lock``."""
        generation = _watch_look()
        if generation is not None and self._synced_at == generation:
            return
        trusted = generation is not None and _watch_cover(
            [(self.workspace / self.scope.facts).parent, self.workspace / self.scope.logs])
        if trusted and (self.workspace / self.scope.logs).is_symlink():
            trusted = False  # re-pointing it is an event in a folder not watched
        self.index.sync(*self._scan(), self._load)
        self._synced_at = generation if trusted else None

    def _scan(self) -> tuple[list[tuple[str, Path, Signature]], Hashable]:
        """The facts file and the daily logs (the facts are always indexed, so the ranking
        does not depend on which searches came before), and a key that changes whenever what
        ``_logs`` reports does: the facts' signature, the listing, the newest logs'."""
        found: list[tuple[str, Path, Signature]] = []
        facts = self.scope.facts
        path = self.workspace / facts
        with contextlib.suppress(OSError):
            st = path.stat(follow_symlinks=False)
            if path.is_file():
                found.append((facts, path, (st.st_ino, st.st_mtime_ns, st.st_size)))
        logs = self._logs()
        key = (found[0][2] if found else None, self._listings,
               tuple(sig for _, _, sig in logs[-RECENT_LOGS:]))
        found.extend(logs)
        return found, key

    def _logs(self) -> list[tuple[str, Path, Signature]]:
        """The daily logs and their signatures, without a ``stat`` of every one every turn
        (three years of logs took 6 ms a turn). A file made, replaced or removed changes the
        folder, and this store's own writes replace files: then the folder is listed again.
        Otherwise only the newest ``RECENT_LOGS`` are looked at (what gets appended to), and
        the rest every ``FULL_RESCAN_SECONDS``, for a log edited in place by hand."""
        logs = self.scope.logs
        folder = self.workspace / logs
        try:
            st = folder.stat()
        except OSError:
            self._listing = None
            return []
        folder_sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        now = self._clock()
        listing = self._listing
        if listing is not None and listing[0] == folder_sig and \
                now - listing[1] < FULL_RESCAN_SECONDS:
            entries = listing[2]
            for i in range(max(0, len(entries) - RECENT_LOGS), len(entries)):
                rel, path, _ = entries[i]
                try:
                    fst = path.stat(follow_symlinks=False)
                except OSError:  # gone: list again next time
                    self._listing = None
                    continue
                entries[i] = (rel, path, (fst.st_ino, fst.st_mtime_ns, fst.st_size))
            return list(entries)
        entries = []
        try:
            with os.scandir(folder) as found:
                for entry in found:
                    # symlinks are not followed: a log cannot lead search out of the workspace
                    if entry.name.endswith(".md") and not entry.name.startswith(".") \
                            and entry.name != MEMORY_FILE \
                            and entry.is_file(follow_symlinks=False):
                        fst = entry.stat(follow_symlinks=False)
                        entries.append((f"{logs}/{entry.name}", Path(entry.path),
                                        (fst.st_ino, fst.st_mtime_ns, fst.st_size)))
        except (FileNotFoundError, NotADirectoryError):
            pass
        entries.sort()
        self._listing = (folder_sig, now, entries)
        self._listings += 1
        return list(entries)

    @staticmethod
    def _load(rel: str, path: Path) -> tuple[Doc, ...] | None:
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:  # removed since the scan: the next turn sees it gone
            return None
        except OSError as exc:
            _log.warning("memory: cannot read %s: %s", path, exc)
            text = ""
        return parse_docs(rel, text)

    # reading ------------------------------------------------------------------------------

    def search(self, query: str, k: int = 5, *, sources: Sources = "all") -> list[Hit]:
        """The ``k`` best paragraphs for ``query`` by bm25, best first (then by path and
        position); empty when no word of the query occurs in memory. Words under three
        characters alone match unranked (score 0, newest first), so they never pass recall."""
        terms = tokenize(query)
        if not terms or k < 1:
            return []
        with self._index_lock:
            self._sync_index()
            ranked = self.index.search(cjk_grams(terms), k,
                                       leave_out=self.scope.facts if sources == "logs" else None)
        return [Hit(r.path, r.text, r.score, r.line) for r in ranked]

    def recall_sources(self) -> Sources:
        """What recall searches here: only the logs when the facts are in the prompt already
        (unless ``recall_sources: all``), else the facts too."""
        return self.config.recall_sources if self.scope.facts_in_prompt else "all"

    def recall(self, query: str, *, counter: TextCounter, max_tokens: int | None = None,
               max_items: int | None = None, min_score: float | None = None,
               sources: Sources | None = None) -> str | None:
        """The recall block of this scope alone (``recall_block`` for several)."""
        return recall_block([self], query, counter=counter, max_tokens=max_tokens,
                            max_items=max_items, min_score=min_score, sources=sources)


def recall_block(stores: Sequence[MemoryStore], query: str, *, counter: TextCounter,
                 max_tokens: int | None = None, max_items: int | None = None,
                 min_score: float | None = None, sources: Sources | None = None) -> str | None:
    """The recall block for the runtime context from the scopes a turn may read, or None when
    nothing scores above ``min_score``. Unset arguments come from the first store's config.

    By default (``recall_sources: logs``) the owner's MEMORY.md is not searched: it is in the
    system prompt whole, and recalling it would say it twice. The block never exceeds
    ``max_tokens`` by ``counter``: items are added best first (over every scope), and the
    first one that does not fit is cut at a word (or left out when only a few words remain).
    """
    if not stores:
        return None
    cfg = stores[0].config
    max_tokens = cfg.recall_max_tokens if max_tokens is None else max_tokens
    max_items = cfg.recall_max_items if max_items is None else max_items
    min_score = cfg.recall_min_score if min_score is None else min_score
    if max_items < 1 or max_tokens < 1:
        return None
    found = [h for store in stores
             for h in store.search(query, max_items, sources=sources or store.recall_sources())
             if h.score > min_score]
    found.sort(key=lambda h: (-h.score, h.path, h.line))
    lines = [RECALL_HEADER]
    for hit in found[:max_items]:
        item = f"- [{hit.path}] {one_line(hit.text)}"
        if counter.count_text("\n".join([*lines, item])) <= max_tokens:
            lines.append(item)
            continue
        cut = cut_to_fit(lines, item, counter, max_tokens)
        if cut:
            lines.append(cut)
        break
    return "\n".join(lines) if len(lines) > 1 else None


_WATCH_LOCK = threading.Lock()
_WATCH: list[Watch | None] = []
"""One inotify instance for every store's folders (opened on first use; [None]: none)."""


def _watch_look() -> int | None:
    """The shared watch's generation (it grows with any change in any watched folder), or
    None without inotify."""
    with _WATCH_LOCK:
        if not _WATCH:
            _WATCH.append(Watch.open())
        watch = _WATCH[0]
        return watch.look() if watch is not None else None


def _watch_cover(folders: list[Path]) -> bool:
    with _WATCH_LOCK:
        watch = _WATCH[0] if _WATCH else None
        return watch is not None and watch.cover(folders)


def memory_store_for(workspace: Path, config: MemoryConfig | None = None, *,
                     timezone: str = "UTC", scope: MemoryScope = HOME) -> MemoryStore:
    """The one store for this workspace, config and scope, so the tool and the context builder
    share its index (and parse each file once) across turns."""
    config = config or MemoryConfig()
    key = (workspace, config, timezone, scope)
    with _GLOBAL:
        store = _STORES.get(key)
        if store is not None:
            _STORES.move_to_end(key)
            return store
    store = MemoryStore(workspace, config, timezone=timezone, scope=scope)
    with _GLOBAL:
        store = _STORES.setdefault(key, store)
        while len(_STORES) > MAX_STORES:
            _STORES.popitem(last=False)
    return store
