"""Full-text search over past conversations: ``session_search`` and ``parley sessions search``.

Each user and assistant message with text is indexed when its turn is written (in the same
transaction), tagged with its chat (``channel:chat_id``) and the person the turn was for
(``channel:sender_id``: the sender of a user message, the asker of a reply). A search always
names its chat, and optionally its person, so nobody's search reaches another chat's text.

The index is SQLite FTS5 with the trigram tokenizer (SQLite 3.34 or later): substrings in
any script, CJK included, ranked by bm25. It keeps no copy of what it indexes (an "external
content" table over ``messages``): the text is the message's own, read from its body; the chat
and the person are the turn's (``turns.chat``, ``turns.person``: NULL for a turn not indexed).
Where the SQLite in use lacks trigrams, rows of their own go into a plain table searched with
LIKE (slower, unranked beyond recency), as on PostgreSQL; ``search_mode`` says which, and the
gateway logs it once.

The indexed text of a message is ``indexed_text(body)``, and only that: an FTS5 index over
external content removes a row by being told the text it indexed (``delete_rows``), so the
insert and the removal must compute it alike. The index's own ``snippet()``/``highlight()`` and
its ``rebuild`` command would read the JSON body, not that text: they are not used.
"""

from __future__ import annotations

import json
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


__all__ = ["TRIGRAM", "SearchHit", "SearchTables", "delete_rows", "index_statements",
           "indexed_text"]

FTS_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS message_text USING fts5(
    body, tokenize='trigram', content='messages', content_rowid='id', columnsize=0);
"""
"""The index only (its rowid is ``messages.id``). ``columnsize=0``: no table of every row's
token counts; bm25 measures the few rows a search matched from their bodies instead (the JSON,
a little longer than the text: ranks alike). ~330 B a plain turn less than the index with a
copy of each text, chat, person and role it had before (``message_search``, converted once by
``ensure_search``)."""
OLD_FTS = "message_search"
"""The earlier index, with its own copy of each row: converted and dropped at open."""
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
twin("INSERT INTO message_search_plain (id, text, chat, person, role) VALUES (?, ?, ?, ?, ?)",
     "INSERT INTO message_search_plain (id, text, chat, person, role) "
     "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING")
INSERT_FTS = "INSERT INTO message_text (rowid, body) VALUES (?, ?)"
DELETE_FTS = "INSERT INTO message_text (message_text, rowid, body) VALUES ('delete', ?, ?)"


@dataclass(frozen=True, slots=True)
class SearchHit:
    message_id: int
    session_key: str
    created_at: str
    role: str
    person: str | None
    text: str
    """The matching part of the message (the whole message when short)."""


def content_text(content: Any) -> str:
    """A message's content as plain text: text parts joined, images as ``[image]``."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "[image]")) for p in content)
    return str(content or "")


def indexed_text(body: dict[str, Any]) -> str | None:
    """What the index holds of a message: a user's or the assistant's text; None for tool
    results, bare tool calls and empty messages (not indexed)."""
    if body.get("role") not in ("user", "assistant"):
        return None
    return content_text(body.get("content")).strip() or None


def index_statements(rows: list[tuple[int, dict[str, Any]]], chat: str, person: str | None,
                     trigram: bool) -> tuple[str, list[tuple[Any, ...]]]:
    """The statement and its rows that index messages ``(id, body)`` of a turn of ``chat``
    for ``person``: into the FTS5 index (the tags are the turn's), or the plain table."""
    texts = [(i, text, str(body["role"])) for i, body in rows
             if (text := indexed_text(body)) is not None]
    if trigram:
        return INSERT_FTS, [(i, text) for i, text, _ in texts]
    return ("INSERT OR REPLACE INTO message_search_plain (id, text, chat, person, role) "
            "VALUES (?, ?, ?, ?, ?)", [(i, text, chat, person, role) for i, text, role in texts])


def delete_rows(conn: sqlite3.Connection, turns: list[str]) -> int:
    """Take the indexed messages of ``turns`` out of the FTS5 index (before the messages go:
    each removal is told the text ``indexed_text`` gave at its insert). Turns never indexed
    (no chat) have nothing there."""
    marks = ",".join("?" * len(turns))
    found = conn.execute(
        f"SELECT m.id, m.body FROM messages m JOIN turns t ON t.id = m.turn_id "
        f"WHERE m.turn_id IN ({marks}) AND t.chat IS NOT NULL "
        "AND m.role IN ('user', 'assistant')", tuple(turns)).fetchall()
    rows = [(i, text) for i, body in found
            if (text := indexed_text(json.loads(body))) is not None]
    conn.executemany(DELETE_FTS, rows)
    return len(rows)


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
        if self.trigram and self.dialect == "sqlite" and await self.columns(OLD_FTS):
            moved = await self._write(_convert_old_index, slow=True)
            _log.info("session search: %d indexed messages moved to the index without copies",
                      moved)
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
        tags = "t" if self.trigram else "s"  # the FTS5 index: the turn's tags; plain: the row's
        if chat is not None:
            where.append(f"{tags}.chat = ?")
            params.append(chat)
        if person is not None:
            where.append(f"{tags}.person = ?")
            params.append(person)
        rows: list[Any] = []
        long_terms, _ = trigram_terms(terms)
        if self.trigram:
            tagged = "".join(" AND " + w for w in where)
            if long_terms:
                for joiner in ("AND", "OR"):
                    rows = await self._fetchall_thread(
                        "SELECT s.rowid, se.key, m.created_at, m.role, t.person, m.body "
                        "FROM message_text s JOIN messages m ON m.id = s.rowid "
                        "JOIN turns t ON t.id = m.turn_id "
                        "JOIN sessions se ON se.id = m.session_id "
                        f"WHERE message_text MATCH ? AND t.chat IS NOT NULL{tagged} "
                        "ORDER BY rank, s.rowid DESC LIMIT ?",
                        (match_expr(long_terms, joiner), *params, limit))
                    if rows or len(long_terms) == 1:
                        break
            else:  # words under three characters: the chat's indexed messages, newest first
                rows = await self._like_indexed(terms, tagged, params, limit)
            hits = [(r[0], r[1], r[2], r[3], r[4], indexed_text(json.loads(r[5])) or "")
                    for r in rows]
            return [SearchHit(*h[:5], _snippet(h[5], terms)) for h in hits]
        else:
            like = "ILIKE" if self.dialect == "postgresql" else "LIKE"  # SQLite's: no case
            likes = " AND ".join(f"s.text {like} ? ESCAPE '\\'" for _ in terms)
            escaped = [like_pattern(t) for t in terms]
            rows = await self._fetchall_thread(
                "SELECT s.id, se.key, m.created_at, s.role, s.person, s.text "
                "FROM message_search_plain s JOIN messages m ON m.id = s.id "
                "JOIN sessions se ON se.id = m.session_id "
                f"WHERE {likes} {''.join(' AND ' + w for w in where)} "
                "ORDER BY s.id DESC LIMIT ?", (*escaped, *params, limit))
        return [SearchHit(r[0], r[1], r[2], r[3], r[4], _snippet(r[5], terms)) for r in rows]

    async def _like_indexed(self, terms: list[str], tagged: str, params: list[Any],
                            limit: int) -> list[Any]:
        """Short words (no trigram to look up): the tagged turns' messages, newest first,
        whose text holds every word (read in pages, as the earlier LIKE over the index's
        copy of the texts did in one statement)."""
        found: list[Any] = []
        before = None
        while len(found) < limit:
            page = await self._fetchall_thread(
                "SELECT m.id, se.key, m.created_at, m.role, t.person, m.body FROM messages m "
                "JOIN turns t ON t.id = m.turn_id JOIN sessions se ON se.id = m.session_id "
                f"WHERE t.chat IS NOT NULL{tagged} AND m.role IN ('user', 'assistant')"
                f"{' AND m.id < ?' if before is not None else ''} ORDER BY m.id DESC LIMIT 500",
                (*params, *((before,) if before is not None else ())))
            for row in page:
                text = (indexed_text(json.loads(row[5])) or "").casefold()
                if all(t.casefold() in text for t in terms):
                    found.append(row)
            if len(page) < 500:
                break
            before = page[-1][0]
        return found[:limit]


def _convert_old_index(conn: sqlite3.Connection) -> int:
    """Once, in one transaction: the earlier index's rows (with their own copies) go into
    ``message_text`` as they were indexed, their chat and person onto their turns; then the
    earlier index is dropped. A row whose message is gone is left behind with it."""
    rows = conn.execute(
        f"SELECT s.rowid, s.text, s.chat, s.person, m.turn_id FROM {OLD_FTS} s "
        "JOIN messages m ON m.id = s.rowid").fetchall()
    conn.executemany(INSERT_FTS, [(r[0], r[1]) for r in rows])
    tags = {r[4]: (r[2], r[3]) for r in rows}
    conn.executemany("UPDATE turns SET chat = ?, person = ? WHERE id = ?",
                     [(chat, person, turn) for turn, (chat, person) in tags.items()])
    conn.execute(f"DROP TABLE {OLD_FTS}")
    return len(rows)
