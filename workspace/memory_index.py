"""One memory scope's paragraphs in SQLite FTS5, ranked by FTS5's ``bm25()``.

The same index as the conversation search (``gateway/kernel/fts.py``): the trigram tokenizer
where SQLite has it (substrings in any script, CJK included), else FTS5's word tokenizer, each
logged once. The table lives in memory, one per ``MemoryStore``, so one scope's notes are never
in another's index. It is kept in step with the files incrementally: a file is parsed and its
rows replaced only when its signature (inode, mtime, size) changed, and a turn whose files all
kept theirs touches nothing (``files_indexed`` counts the files written into the index).

``PRIOR_DOCS`` rows of filler that no query can match sit beside the paragraphs: with only a
few notes a shared word is still telling (FTS5's idf is near zero for a word in half the rows,
so one note alone could never be recalled); with hundreds they no longer matter. They are as
long as the average paragraph so they do not move bm25's length normalisation.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from gateway.kernel.frozen import frozen
from gateway.kernel.fts import like_pattern, match_expr, quote, tokenizer, trigram_terms

_log = logging.getLogger(__name__)

Signature = tuple[int, int, int]
"""(inode, mtime_ns, size): an atomic replace always changes the inode, even within one tick."""
PRIOR_DOCS = 10
MAX_QUERY_TERMS = 64
TOKENIZER = tokenizer()
if TOKENIZER != "trigram":
    _log.warning("memory recall: this SQLite (%s) has %s: %s", sqlite3.sqlite_version,
                 "no FTS5 trigram tokenizer (3.34 or later)" if TOKENIZER else "no FTS5",
                 "matching whole words only, CJK text only as whole runs" if TOKENIZER
                 else "memory search finds nothing")


@frozen
class Doc:
    """One searchable paragraph of a memory file."""

    path: str
    line: int
    text: str
    body: str
    """What is indexed: the text without its bullets and ``[HH:MM]`` stamps."""


@frozen
class Ranked:
    score: float
    """``-bm25()``: higher is better; 0.0 for a match by short words alone (unranked)."""
    path: str
    line: int
    text: str


class MemoryIndex:
    """The FTS5 table of one store. Not thread-safe: the store calls it under its lock."""

    def __init__(self) -> None:
        self.files_indexed = 0
        self._conn: sqlite3.Connection | None = None
        """Opened with the first file to index: a scope with no notes (most people's) costs
        no SQLite connection."""
        self._files: dict[str, tuple[Signature, list[int], int]] = {}
        """Per file: its signature when indexed, its rows, their summed body length."""
        self._synced: Hashable = None
        self._next_rowid = 1
        self._size = 0
        """Summed length of the real rows' bodies (for the prior rows' length)."""
        self._rows = 0
        self._prior = 0
        """The prior rows' length, 0 before they exist."""
        self._df: dict[str, int] = {}
        """Rows matching each query word seen since the table last changed."""

    @property
    def opened(self) -> bool:
        """Whether this scope's table exists (it does once a file was indexed)."""
        return self._conn is not None

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = sqlite3.connect(":memory:", check_same_thread=False)
            self._conn.execute("CREATE VIRTUAL TABLE para USING fts5(body, path UNINDEXED, "
                               f"line UNINDEXED, text UNINDEXED, tokenize='{TOKENIZER}')")
        return self._conn

    def sync(self, found: Sequence[tuple[str, Path, Signature]], key: Hashable,
             load: Callable[[str, Path], tuple[Doc, ...] | None]) -> None:
        """Bring the table in step with ``found`` (every file of the scope); ``key`` changes
        whenever ``found`` may have (the same key as last time: nothing to look at); ``load``
        parses one file, None when it vanished since it was listed (tried again next time)."""
        if key == self._synced or not TOKENIZER:
            return
        if not found and not self._files:  # nothing to index, nothing indexed
            self._synced = key
            return
        complete, changed = True, 0
        with self._db:
            present = {rel for rel, _, _ in found}
            for rel in [r for r in self._files if r not in present]:
                self._drop(rel)
                changed += 1
            for rel, path, sig in found:
                cached = self._files.get(rel)
                if cached is not None and cached[0] == sig:
                    continue
                docs = load(rel, path)
                self._drop(rel)
                if docs is None:
                    complete = False
                    continue
                self._files[rel] = (sig, *self._insert(docs))
                self.files_indexed += 1
                changed += 1
            self._reset_prior()
            self._df.clear()
            if changed:  # one b-tree segment again: queries on a fragmented index cost ~3x
                self._db.execute("INSERT INTO para (para) VALUES ('optimize')")
        self._synced = key if complete else None

    def forget(self, rel: str) -> None:
        """Re-read ``rel`` on the next sync (this store just wrote it)."""
        self._synced = None
        if rel in self._files:
            self._files[rel] = ((-1, -1, -1), *self._files[rel][1:])

    def _drop(self, rel: str) -> None:
        entry = self._files.pop(rel, None)
        if entry is None:
            return
        self._size -= entry[2]
        self._rows -= len(entry[1])
        self._db.executemany("DELETE FROM para WHERE rowid = ?", [(r,) for r in entry[1]])

    def _insert(self, docs: tuple[Doc, ...]) -> tuple[list[int], int]:
        rowids = list(range(self._next_rowid, self._next_rowid + len(docs)))
        self._next_rowid += len(docs)
        self._db.executemany(
            "INSERT INTO para (rowid, body, path, line, text) VALUES (?, ?, ?, ?, ?)",
            [(r, d.body, d.path, d.line, d.text) for r, d in zip(rowids, docs, strict=True)])
        size = sum(_length(d.body) for d in docs)
        self._size += size
        self._rows += len(docs)
        return rowids, size

    def _reset_prior(self) -> None:
        average = round(self._size / self._rows) if self._rows else 1
        if self._prior and abs(average - self._prior) * 8 <= self._prior:
            return  # within an eighth: left as they are (each rewrite costs index segments)
        self._prior = average
        filler = "." * max(3, average) if TOKENIZER == "trigram" else " ".join(["x"] * average)
        self._db.execute("DELETE FROM para WHERE rowid <= 0")
        self._db.executemany("INSERT INTO para (rowid, body, path, line, text) "
                             "VALUES (?, ?, '', 0, '')",
                             [(-i, filler) for i in range(PRIOR_DOCS)])

    def search(self, terms: Sequence[str], k: int, *, leave_out: str | None = None
               ) -> list[Ranked]:
        """The ``k`` best paragraphs for ``terms`` (distinct query words, stopwords gone), best
        first, ties by path then line; ``leave_out``: a file not to return."""
        if not TOKENIZER or not terms or not self._rows:
            return []
        trigram = TOKENIZER == "trigram"
        long, short = trigram_terms(terms) if trigram else (list(terms), [])
        if len(long) > MAX_QUERY_TERMS:  # a pasted page: its longest words carry the score
            long = sorted(long, key=lambda t: (-len(t), t))[:MAX_QUERY_TERMS]
        # a word in half the rows or more has no weight in bm25 (FTS5's idf is floored at
        # 1e-6 there) but costs the most to rank: counted once, then left out of the query
        rows_total = self._rows + PRIOR_DOCS
        long = [t for t in long if 2 * self._count(t, prefix=not trigram) < rows_total]
        if not long and not short:
            return []
        skip = " AND path != ?" if leave_out is not None else ""
        extra = (leave_out,) if leave_out is not None else ()
        if long:
            rows = self._db.execute(
                "SELECT -bm25(para), path, line, text FROM para WHERE para MATCH ? AND "
                f"rowid > 0{skip} ORDER BY bm25(para), path, line LIMIT ?",
                (match_expr(long, "OR", prefix=not trigram), *extra, k)).fetchall()
        else:  # only words under three characters: no trigram to use, no rank
            likes = " AND ".join("body LIKE ? ESCAPE '\\'" for _ in short)
            rows = self._db.execute(
                f"SELECT 0.0, path, line, text FROM para WHERE rowid > 0 AND {likes}{skip} "
                "ORDER BY path DESC, line LIMIT ?",
                (*(like_pattern(t) for t in short), *extra, k)).fetchall()
        return [Ranked(float(r[0]), r[1], int(r[2]), r[3]) for r in rows]


    def _count(self, term: str, *, prefix: bool) -> int:
        count = self._df.get(term)
        if count is None:
            count = self._db.execute("SELECT count(*) FROM para WHERE para MATCH ?",
                                     (quote(term, prefix=prefix),)).fetchone()[0]
            self._df[term] = count
        return count


def _length(body: str) -> int:
    return len(body) if TOKENIZER == "trigram" else len(body.split())
