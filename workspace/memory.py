"""Memory: lasting facts in ``MEMORY.md``, daily logs in ``memory/YYYY-MM-DD.md``, BM25 recall.

``MEMORY.md`` is a system-prompt layer, sent whole with every request, so it holds a few lasting
facts and is capped (``max_memory_chars``): past the cap the model is told to consolidate it,
never to let it grow. The daily logs hold everything else; they never go into the prompt whole,
only as recall: the paragraphs that best match the user's message, within a token cap.

Search is BM25 over paragraphs (blank-line separated; a heading sticks to the paragraph after
it; long paragraphs are split), offline and deterministic: the same files and query give the
same hits in the same order. A file is parsed once per version (inode, mtime, size), and the
corpus statistics are rebuilt only when some file changed, so a turn over unchanged memory costs
one ``stat`` per file. Writes append under a lock and replace the file atomically.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol
from zoneinfo import ZoneInfo

from gateway.kernel.config import MemoryConfig
from workspace.bootstrap import MEMORY_FILE

_log = logging.getLogger(__name__)

MemoryKind = Literal["fact", "log"]
Sources = Literal["logs", "all"]
LOG_DIR = "memory"
RECENT_LOGS = 3
"""Daily logs looked at on every turn (today's, and yesterday's across midnight and zones)."""
FULL_RESCAN_SECONDS = 60.0
RECALL_HEADER = "Memory recall (may be relevant):"
MAX_ENTRY_CHARS = 2000
MAX_CHUNK_CHARS = 800
MAX_QUERY_TERMS = 64
_MIN_CUT_WORDS = 4
_K1, _B = 1.5, 0.75
_PRIOR_DOCS = 10
"""Paragraphs without any query word assumed beside the real ones when weighing words: with
only a few notes, a shared word is still telling (plain idf would call it common); with
hundreds the prior no longer matters."""

_WORD = re.compile(r"\w+")
_HEADING = re.compile(r"^#{1,6}\s+(.*)$")
_PLACEHOLDER = re.compile(r"^\(.*\)$", re.S)
_MARKER = re.compile(r"^[ \t]*(?:[-*+][ \t]+|\[\d{1,2}:\d{2}\][ \t]*)+", re.M)
_STOPWORDS = frozenset("""
a about after all also am an and any are as at be been but by can could did do does for from
had has have he hello her hey hi him his how i if in into is it its just me my no not of ok okay
on or our please she so than thank thanks that the their them then there these they this to up
us was we were what when where which who why will with would yes you your
""".split())

Signature = tuple[int, int, int]
"""(inode, mtime_ns, size): an atomic replace always changes the inode, even within one tick."""


class MemoryRefused(ValueError):
    """A write the model should rethink (empty, too long, MEMORY.md full); the text says how."""


class TextCounter(Protocol):
    def count_text(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Hit:
    path: str
    """Relative to the workspace, with ``/``: ``MEMORY.md``, ``memory/2026-11-20.md``."""
    text: str
    score: float
    line: int
    """1-based line of the file where the paragraph starts."""


@dataclass(frozen=True, slots=True)
class Saved:
    path: str
    written: bool
    """False when the same text was already there (nothing was written)."""


@dataclass(frozen=True, slots=True)
class _Doc:
    path: str
    line: int
    text: str
    terms: dict[str, int]
    length: int


def tokenize(text: str) -> list[str]:
    """Lowercase words without stopwords, a plural ``s`` dropped (dentists ~ dentist)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word in _STOPWORDS or (len(word) < 2 and not word.isdigit()):
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
            word = word[:-1]
        out.append(word)
    return out


def _split_long(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Pieces of at most ``MAX_CHUNK_CHARS``, cut between lines, else at a space."""
    pieces: list[tuple[int, str]] = []
    current: list[str] = []
    first, size = 0, 0
    for no, line in lines:
        while len(line) > MAX_CHUNK_CHARS:
            cut = line.rfind(" ", 0, MAX_CHUNK_CHARS)
            cut = cut if cut > MAX_CHUNK_CHARS // 2 else MAX_CHUNK_CHARS
            if current:
                pieces.append((first, "\n".join(current)))
                current, size = [], 0
            pieces.append((no, line[:cut].rstrip()))
            line = line[cut:].lstrip()
        if not line:
            continue
        if current and size + len(line) + 1 > MAX_CHUNK_CHARS:
            pieces.append((first, "\n".join(current)))
            current, size = [], 0
        if not current:
            first = no
        current.append(line)
        size += len(line) + 1
    if current:
        pieces.append((first, "\n".join(current)))
    return pieces


def split_paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each searchable paragraph.

    The file's title (a level-1 heading on its first line) is left out; a block of headings
    alone sticks to the paragraph after it; template placeholders, paragraphs that are one
    parenthesised remark like ``(Long-term facts ...)``, are skipped with their heading.
    """
    blocks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if no == 1 and line.startswith("# "):
            continue
        if line.strip():
            current.append((no, line))
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    out: list[tuple[int, str]] = []
    pending: list[tuple[int, str]] = []
    for block in blocks:
        body = [line for _, line in block if not _HEADING.match(line)]
        if not body:
            pending = block
        elif _PLACEHOLDER.match(" ".join(line.strip() for line in body)):
            pending = []
        else:
            out.extend(_split_long(pending + block))
            pending = []
    return out


def _parse(path: str, text: str) -> tuple[_Doc, ...]:
    docs = []
    for line, chunk in split_paragraphs(text):
        terms = tokenize(_MARKER.sub("", chunk))  # the [HH:MM] stamps are not words to match
        if terms:
            docs.append(_Doc(path, line, chunk, dict(Counter(terms)), len(terms)))
    return tuple(docs)


class _Corpus:
    """BM25 (k1 1.5, b 0.75, Lucene's always-positive idf, ``_PRIOR_DOCS``) over paragraphs."""

    def __init__(self, docs: list[_Doc]) -> None:
        self.docs = docs
        avgdl = sum(d.length for d in docs) / len(docs) if docs else 1.0
        self.norms = [_K1 * (1 - _B + _B * d.length / avgdl) for d in docs]
        postings: dict[str, list[tuple[int, int]]] = {}
        for i, doc in enumerate(docs):
            for term, tf in doc.terms.items():
                postings.setdefault(term, []).append((i, tf))
        n = len(docs) + _PRIOR_DOCS
        self.postings = postings
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
                    for t, p in postings.items()}

    def top(self, terms: list[str], k: int) -> list[tuple[float, _Doc]]:
        known = [t for t in dict.fromkeys(terms) if t in self.idf]  # each query word once
        if len(known) > MAX_QUERY_TERMS:  # a pasted page: its rarest words carry the score
            known = sorted(known, key=lambda t: (-self.idf[t], t))[:MAX_QUERY_TERMS]
        scores: dict[int, float] = {}
        for term in known:
            idf = self.idf[term]
            for i, tf in self.postings[term]:
                scores[i] = scores.get(i, 0.0) + idf * tf * (_K1 + 1) / (tf + self.norms[i])
        # docs are in (path, position) order, so the index breaks ties by path, then position
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [(score, self.docs[i]) for i, score in ranked]


def _clean(text: str) -> str:
    """The entry as written: trailing spaces and blank lines removed, so it stays one paragraph."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())


def _key(text: str) -> str:
    """What counts as the same entry: case, spacing, bullets and ``[HH:MM]`` stamps ignored."""
    return " ".join(" ".join(_MARKER.sub("", line) for line in text.lower().splitlines()).split())


def _keys(text: str) -> set[str]:
    keys: set[str] = set()
    for _, chunk in split_paragraphs(text):
        keys.add(_key(chunk))
        keys.update(_key(line) for line in chunk.splitlines())
    return keys


def _one_line(text: str) -> str:
    """A paragraph as one recall line: ``## Projects`` becomes ``Projects:``, bullets ``;``."""
    parts: list[str] = []
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            parts.append(heading.group(1).strip() + ":")
        else:
            stripped = re.sub(r"^\s*[-*+]\s+", "", line).strip()
            if parts and re.match(r"^\s*[-*+]\s+", line) and not parts[-1].endswith(":"):
                parts[-1] += ";"
            parts.append(stripped)
    return " ".join(" ".join(parts).split())


def _atomic_write(path: Path, data: bytes) -> None:
    target = path.resolve()  # through a symlink: replace its target, never the link itself
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, target.stat().st_mode & 0o777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


_WRITE_LOCKS: dict[Path, threading.Lock] = {}
_STORES: dict[tuple[Path, MemoryConfig, str], MemoryStore] = {}
_GLOBAL = threading.Lock()


@contextlib.contextmanager
def _across_processes(root: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the workspace folder itself (no lock file to show up in the
    agent's listings): the gateway and ``parley chat`` on one workspace append in turn, so
    neither's read-modify-write loses the other's note. Where flock is missing (Windows),
    only this process's own lock applies."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_lock_for(root: Path) -> threading.Lock:
    """One lock per workspace, shared by every store on it: appends never interleave."""
    with _GLOBAL:
        return _WRITE_LOCKS.setdefault(root, threading.Lock())


class MemoryStore:
    """The memory files of one workspace. Thread-safe; the tools call it through a thread."""

    def __init__(self, workspace: Path, config: MemoryConfig | None = None, *,
                 timezone: str = "UTC", clock: Callable[[], float] = time.monotonic) -> None:
        self.workspace = workspace
        self.config = config or MemoryConfig()
        self.tz = ZoneInfo(timezone)
        self._clock = clock
        self._listing: tuple[Signature, float, list[tuple[str, Path, Signature]]] | None = None
        """The daily logs as last listed: (folder signature, when, entries sorted by name)."""
        self._write_lock = _write_lock_for(workspace.expanduser().resolve())
        self._index_lock = threading.Lock()
        self._files: dict[str, tuple[Signature, tuple[_Doc, ...]]] = {}
        self._corpora: dict[Sources, tuple[tuple[tuple[str, Signature], ...], _Corpus]] = {}

    # writing ------------------------------------------------------------------------------

    def remember(self, text: str, *, kind: MemoryKind = "fact", when: datetime) -> Saved:
        """Append ``text`` as one paragraph: a fact to MEMORY.md, a log entry to the daily log
        of ``when``'s date in the configured timezone (stamped with its time). An entry already
        in that file is not written twice."""
        if when.tzinfo is None:
            raise ValueError("when must be timezone-aware")
        body = _clean(text)
        if not body:
            raise MemoryRefused("text is empty; say what to remember")
        if len(body) > MAX_ENTRY_CHARS:
            raise MemoryRefused(f"text is {len(body):,} characters; keep one memory under "
                                f"{MAX_ENTRY_CHARS:,}: save the gist, or split it into notes")
        if kind == "fact":
            lines = body.splitlines()
            entry = "\n".join([f"- {lines[0]}", *(f"  {line}" for line in lines[1:])])
            return self._append(MEMORY_FILE, "Memory", entry, limit=self.config.max_memory_chars)
        if not self.config.daily_log:
            raise MemoryRefused("daily logs are turned off (agent.memory.daily_log); "
                                "save lasting facts with kind=fact")
        local = when.astimezone(self.tz)
        day = f"{local:%Y-%m-%d}"
        return self._append(f"{LOG_DIR}/{day}.md", day, f"[{local:%H:%M}] {body}")

    def _append(self, rel: str, title: str, entry: str, *, limit: int | None = None) -> Saved:
        path = self.workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._write_lock, _across_processes(self.workspace):
            try:
                raw: bytes | None = path.read_bytes()
            except FileNotFoundError:
                raw = None
            current = raw.decode("utf-8", errors="replace") if raw is not None else ""
            if _key(entry) in _keys(current):
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
            _atomic_write(path, (raw or b"") + addition.encode("utf-8"))
        with self._index_lock:
            self._files.pop(rel, None)
        _log.info("memory: saved %d characters to %s", len(entry), rel)
        return Saved(rel, True)

    # index --------------------------------------------------------------------------------

    def _scan(self, sources: Sources) -> list[tuple[str, Path, Signature]]:
        found: list[tuple[str, Path, Signature]] = []
        if sources == "all":
            path = self.workspace / MEMORY_FILE
            with contextlib.suppress(OSError):
                st = path.stat()
                if path.is_file():
                    found.append((MEMORY_FILE, path, (st.st_ino, st.st_mtime_ns, st.st_size)))
        found.extend(self._logs())
        found.sort()
        return found

    def _logs(self) -> list[tuple[str, Path, Signature]]:
        """The daily logs and their signatures, without a ``stat`` of every one every turn
        (three years of logs took 6 ms a turn). A file made, replaced or removed changes the
        folder, and this store's own writes replace files: then the folder is listed again.
        Otherwise only the newest ``RECENT_LOGS`` are looked at (what gets appended to), and
        the rest every ``FULL_RESCAN_SECONDS``, for a log edited in place by hand."""
        folder = self.workspace / LOG_DIR
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
                            and entry.is_file(follow_symlinks=False):
                        fst = entry.stat(follow_symlinks=False)
                        entries.append((f"{LOG_DIR}/{entry.name}", Path(entry.path),
                                        (fst.st_ino, fst.st_mtime_ns, fst.st_size)))
        except (FileNotFoundError, NotADirectoryError):
            pass
        entries.sort()
        self._listing = (folder_sig, now, entries)
        return list(entries)

    def _docs(self, rel: str, path: Path, sig: Signature) -> tuple[_Doc, ...]:
        cached = self._files.get(rel)
        if cached and cached[0] == sig:
            return cached[1]
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:  # removed since the scan: the next turn sees it gone
            return ()
        except OSError as exc:
            _log.warning("memory: cannot read %s: %s", path, exc)
            text = ""
        docs = _parse(rel, text)
        self._files[rel] = (sig, docs)
        return docs

    def _corpus(self, sources: Sources) -> _Corpus:
        found = self._scan(sources)
        sig = tuple((rel, s) for rel, _, s in found)
        cached = self._corpora.get(sources)
        if cached and cached[0] == sig:
            return cached[1]
        docs: list[_Doc] = []
        for rel, path, s in found:
            docs.extend(self._docs(rel, path, s))
        present = {rel for rel, _, _ in found}
        for rel in list(self._files):
            if rel not in present and (sources == "all" or rel != MEMORY_FILE):
                del self._files[rel]
        corpus = _Corpus(docs)
        self._corpora[sources] = (sig, corpus)
        return corpus

    # reading ------------------------------------------------------------------------------

    def search(self, query: str, k: int = 5, *, sources: Sources = "all") -> list[Hit]:
        """The ``k`` best paragraphs for ``query``, best first (then by path and position);
        empty when no word of the query occurs in memory."""
        terms = tokenize(query)
        if not terms or k < 1:
            return []
        with self._index_lock:
            corpus = self._corpus(sources)
        return [Hit(doc.path, doc.text, score, doc.line) for score, doc in corpus.top(terms, k)]

    def recall(self, query: str, *, counter: TextCounter, max_tokens: int | None = None,
               max_items: int | None = None, min_score: float | None = None,
               sources: Sources | None = None) -> str | None:
        """The recall block for the runtime context, or None when nothing scores above
        ``min_score``. Unset arguments come from the config.

        By default (``recall_sources: logs``) only the daily logs are searched: MEMORY.md is
        already in the system prompt whole, and recalling it would say it twice. The block never
        exceeds ``max_tokens`` by ``counter``: items are added best first, and the first one that
        does not fit is cut at a word (or left out when only a few words would remain).
        """
        cfg = self.config
        max_tokens = cfg.recall_max_tokens if max_tokens is None else max_tokens
        max_items = cfg.recall_max_items if max_items is None else max_items
        min_score = cfg.recall_min_score if min_score is None else min_score
        if max_items < 1 or max_tokens < 1:
            return None
        hits = [h for h in self.search(query, max_items, sources=sources or cfg.recall_sources)
                if h.score > min_score]
        lines = [RECALL_HEADER]
        for hit in hits:
            item = f"- [{hit.path}] {_one_line(hit.text)}"
            if counter.count_text("\n".join([*lines, item])) <= max_tokens:
                lines.append(item)
                continue
            cut = _cut_to_fit(lines, item, counter, max_tokens)
            if cut:
                lines.append(cut)
            break
        return "\n".join(lines) if len(lines) > 1 else None


def _cut_to_fit(lines: list[str], item: str, counter: TextCounter, max_tokens: int) -> str | None:
    """The longest word prefix of ``item`` (with an ellipsis) for which the block still fits."""
    words = item.split(" ")
    prefix = 2  # "-" and "[path]"

    def candidate(n: int) -> str:
        return " ".join(words[:n]) + " …"

    def fits(n: int) -> bool:
        return counter.count_text("\n".join([*lines, candidate(n)])) <= max_tokens

    low, high = prefix + _MIN_CUT_WORDS, len(words) - 1
    if low > high or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return candidate(low)


def memory_store_for(workspace: Path, config: MemoryConfig | None = None, *,
                     timezone: str = "UTC") -> MemoryStore:
    """The one store for this workspace and config, so the tool and the context builder share
    its index (and parse each file once) across turns."""
    config = config or MemoryConfig()
    key = (workspace, config, timezone)
    with _GLOBAL:
        store = _STORES.get(key)
    if store is None:
        store = MemoryStore(workspace, config, timezone=timezone)
        with _GLOBAL:
            store = _STORES.setdefault(key, store)
    return store
