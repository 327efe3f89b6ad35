"""Full-text search over past conversations: ``session_search`` and ``parley sessions search``.

Each user and assistant message with text is indexed when its turn is written (in the same
transaction), tagged with its chat (``channel:chat_id``) and the person the turn was for
(``channel:sender_id``: the sender of a user message, the asker of a reply). A search always
names its chat, and optionally its person, so nobody's search reaches another chat's text.

The index is SQLite FTS5 with the trigram tokenizer (SQLite 3.34 or later): substrings in
any script, CJK included, ranked by bm25. Where the SQLite in use lacks it, the same rows go
into a plain table searched with LIKE (slower, unranked beyond recency); ``search_mode`` says
which, and the gateway logs it once.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

from gateway.kernel.fts import TRIGRAM, like_pattern, match_expr, query_words, trigram_terms
from gateway.kernel.store_db import Database
from gateway.kernel.store_sql import TableSet, register, twin

_log = logging.getLogger(__name__)

MAX_QUERY_TERMS = 16
SNIPPET_CHARS = 240


__all__ = ["TRIGRAM", "SearchHit", "SearchTables", "insert_sql"]

FTS_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS message_search USING fts5(
    text, chat UNINDEXED, person UNINDEXED, role UNINDEXED, tokenize='trigram',
    columnsize=0);
"""
"""``columnsize=0``: no table of every row's token counts (~60 B a turn); a search's ranking
counts the few rows it matched instead. A database made before keeps its table as it is."""
PLAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS message_search_plain (
    id INTEGER PRIMARY KEY, text TEXT NOT NULL, chat TEXT NOT NULL, person TEXT,
    role TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS message_search_plain_chat ON message_search_plain(chat, id);
"""


PLAIN_SCHEMA_PG = PLAIN_SCHEMA.replace("INTEGER", "BIGINT")
"""PostgreSQL's twin: the plain table (no FTS5 there), searched with ILIKE."""
TABLES = register(TableSet("search", (), ("message_search_plain",),
                           upsert_keys={"message_search_plain": ("id",)}))
"""Made by ``ensure_search`` (which table depends on this SQLite); copied from SQLite only
where SQLite used the plain table (``backfill_search`` indexes the rest)."""
twin("INSERT INTO message_search (rowid, text, chat, person, role) VALUES (?, ?, ?, ?, ?)",
     "INSERT INTO message_search_plain (id, text, chat, person, role) "
     "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING")


@dataclass(frozen=True, slots=True)
class SearchHit:
    message_id: int
    session_key: str
    created_at: str
    role: str
    person: str | None
    text: str
    """The matching part of the message (the whole message when short)."""


def insert_sql(trigram: bool) -> str:
    if trigram:
        return ("INSERT INTO message_search (rowid, text, chat, person, role) "
                "VALUES (?, ?, ?, ?, ?)")
    return ("INSERT OR REPLACE INTO message_search_plain (id, text, chat, person, role) "
            "VALUES (?, ?, ?, ?, ?)")


def _snippet(text: str, terms: list[str]) -> str:
    if len(text) <= SNIPPET_CHARS:
        return text
    lower = text.lower()
    at = min((i for t in terms if (i := lower.find(t)) >= 0), default=0)
    start = max(0, at - SNIPPET_CHARS // 3)
    piece = text[start:start + SNIPPET_CHARS]
    return ("…" if start else "") + piece + ("…" if start + SNIPPET_CHARS < len(text) else "")


class SearchTables(Database):
    """The search index's table and its one query."""

    search_mode = "fts5-trigram" if TRIGRAM else "like"
    trigram = TRIGRAM
    """False on PostgreSQL: the plain table, searched with ILIKE."""

    async def ensure_search(self) -> None:
        await self.ensure_schema(FTS_SCHEMA if TRIGRAM else PLAIN_SCHEMA,
                                 postgres=PLAIN_SCHEMA_PG)
        if not self.trigram and self.dialect == "sqlite":
            _log.warning("session search: this SQLite (%s) has no FTS5 trigram tokenizer "
                         "(3.34 or later): searching with LIKE, slower and unranked",
                         sqlite3.sqlite_version)

    async def search_messages(self, query: str, *, chat: str | None, person: str | None = None,
                              limit: int = 5) -> list[SearchHit]:
        """Past messages of ``chat`` (None: every chat, for the owner's CLI) matching
        ``query``; with ``person`` only those of the turns that person asked."""
        terms = query_words(query, MAX_QUERY_TERMS)
        if not terms:
            return []
        where, params = [], []
        if chat is not None:
            where.append("s.chat = ?")
            params.append(chat)
        if person is not None:
            where.append("s.person = ?")
            params.append(person)
        rows: list[Any] = []
        long_terms, _ = trigram_terms(terms)
        if self.trigram and long_terms:
            for joiner in ("AND", "OR"):
                rows = await self._fetchall_thread(
                    "SELECT s.rowid, se.key, m.created_at, s.role, s.person, s.text "
                    "FROM message_search s JOIN messages m ON m.id = s.rowid "
                    "JOIN sessions se ON se.id = m.session_id "
                    f"WHERE message_search MATCH ? {''.join(' AND ' + w for w in where)} "
                    "ORDER BY rank, s.rowid DESC LIMIT ?",
                    (match_expr(long_terms, joiner), *params, limit))
                if rows or len(long_terms) == 1:
                    break
        else:
            table = "message_search" if self.trigram else "message_search_plain"
            key = "rowid" if self.trigram else "id"
            like = "ILIKE" if self.dialect == "postgresql" else "LIKE"  # SQLite's: no case
            likes = " AND ".join(f"s.text {like} ? ESCAPE '\\'" for _ in terms)
            escaped = [like_pattern(t) for t in terms]
            rows = await self._fetchall_thread(
                f"SELECT s.{key}, se.key, m.created_at, s.role, s.person, s.text "
                f"FROM {table} s JOIN messages m ON m.id = s.{key} "
                "JOIN sessions se ON se.id = m.session_id "
                f"WHERE {likes} {''.join(' AND ' + w for w in where)} "
                f"ORDER BY s.{key} DESC LIMIT ?", (*escaped, *params, limit))
        return [SearchHit(r[0], r[1], r[2], r[3], r[4], _snippet(r[5], terms)) for r in rows]
