"""SQLite FTS5 pieces shared by the two searches: past conversations (``store_search``) and the
memory recall over daily logs (``workspace/memory_index``).

One tokenizer choice for both: FTS5's ``trigram`` (SQLite 3.34 or later) where this process's
SQLite has it, so substrings in any script match, CJK included; a term shorter than three
characters cannot use a trigram index and is matched with LIKE instead. Without it the callers
fall back visibly (each logs which mode it runs in). Query text never reaches MATCH as syntax:
every term is quoted as an FTS5 string, so ``"``, ``*``, ``NEAR(``, ``-`` or ``:`` in a message
are only characters to look for.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable

MIN_TRIGRAM_CHARS = 3
"""The shortest term a trigram index can match; shorter ones go through LIKE."""


def _probe(tokenize: str) -> bool:
    try:
        with sqlite3.connect(":memory:") as probe:
            probe.execute(f"CREATE VIRTUAL TABLE t USING fts5(x, tokenize='{tokenize}')")
        return True
    except sqlite3.Error:
        return False


TRIGRAM = _probe("trigram")
"""Whether this process's SQLite has FTS5 with the trigram tokenizer."""
FTS5 = TRIGRAM or _probe("unicode61")
"""Whether it has FTS5 at all (word tokens, ``unicode61``, when trigram is missing)."""


def tokenizer() -> str | None:
    """The FTS5 tokenizer to index with: ``trigram``, else ``unicode61``, else None."""
    return "trigram" if TRIGRAM else "unicode61" if FTS5 else None


def query_words(text: str, limit: int) -> list[str]:
    """The distinct lowercase words of ``text`` (``\\w`` runs), first ``limit`` of them."""
    return list(dict.fromkeys(re.findall(r"\w+", text.lower())))[:limit]


def quote(term: str, *, prefix: bool = False) -> str:
    """``term`` as one FTS5 string (its quotes doubled), ``prefix``: any word it begins."""
    return '"' + term.replace('"', '""') + '"' + ("*" if prefix else "")


def match_expr(terms: Iterable[str], joiner: str = "OR", *, prefix: bool = False) -> str:
    """A MATCH expression for ``terms``, each quoted, joined by ``AND`` or ``OR``."""
    if joiner not in ("AND", "OR"):
        raise ValueError(f"joiner must be AND or OR, not {joiner!r}")
    return f" {joiner} ".join(quote(t, prefix=prefix) for t in terms)


def like_pattern(term: str) -> str:
    """A LIKE pattern (with ``ESCAPE '\\'``) finding ``term`` anywhere, its % and _ escaped."""
    return "%" + re.sub(r"([%_\\])", r"\\\1", term) + "%"


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def cjk_grams(terms: Iterable[str]) -> list[str]:
    """``terms`` with each longer run of CJK text (written without spaces, so one ``\\w``
    run is a whole sentence) replaced by its overlapping trigrams: a sentence then finds the
    notes sharing its words, best those sharing the most."""
    out: list[str] = []
    for term in terms:
        if len(term) > MIN_TRIGRAM_CHARS and _CJK.search(term):
            out.extend(term[i:i + MIN_TRIGRAM_CHARS]
                       for i in range(len(term) - MIN_TRIGRAM_CHARS + 1))
        else:
            out.append(term)
    return list(dict.fromkeys(out))


def trigram_terms(terms: Iterable[str]) -> tuple[list[str], list[str]]:
    """``terms`` split into those a trigram index can match and the shorter ones."""
    long: list[str] = []
    short: list[str] = []
    for term in terms:
        (long if len(term) >= MIN_TRIGRAM_CHARS else short).append(term)
    return long, short
