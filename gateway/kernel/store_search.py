"""Full-text search over past conversations: ``session_search`` and ``parley sessions search``.

Each user and assistant message with text is indexed, tagged with its chat
(``channel:chat_id``) and the person the turn was for (``channel:sender_id``: the sender of a
user message, the asker of a reply). A search always names its chat, and optionally its person,
so nobody's search reaches another chat's text.

In the FTS5 index the messages go in batches, not in their turn's transaction: FTS5 writes a
new segment (and rewrites its structure record) at every commit that added rows, which cost a
turn ~0.28 M instructions of ~4.6 M and ~16 pages of write-ahead log (``bench/``). The index
holds exactly the indexable messages up to ``search_state.indexed_upto`` (the mark); those past
it wait. ``index_pending`` indexes them and moves the mark, in one transaction: when
``INDEX_BATCH`` messages wait, before every search (a search never misses what was said a
moment ago), at open (what a crash left waiting) and at close. Removing rows from the index
(``delete_rows``) only ever concerns messages up to the mark. In the plain table (no trigram,
PostgreSQL) rows still go in with their turn.

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

import asyncio
import json
import logging
import sqlite3
from functools import partial
from typing import Any

from gateway.kernel.frozen import frozen
from gateway.kernel.fts import TRIGRAM, like_pattern, match_expr, query_words, trigram_terms
from gateway.kernel.store_db import Database, StoreUnavailable, load_json
from gateway.kernel.store_sql import TableSet, register, twin

_log = logging.getLogger(__name__)

MAX_QUERY_TERMS = 16
SNIPPET_CHARS = 240


__all__ = ["INDEX_BATCH", "TRIGRAM", "SearchHit", "SearchTables", "delete_rows",
           "index_pending", "index_some", "index_statements", "indexed_text"]

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
SEARCH_STATE = """
CREATE TABLE IF NOT EXISTS search_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    indexed_upto INTEGER NOT NULL
);
"""
"""The FTS5 index's mark: every indexable message with an id up to it is in the index, none
past it. Made at open with the newest message's id (an index from before the mark held every
message it was ever given, each with its turn)."""
INDEX_BATCH = 64
"""Messages waiting for the FTS5 index before a write indexes them all at once (~2 ms, against
~0.2 ms a turn when each turn wrote its own)."""
LOOP_INDEX_LIMIT = 4 * INDEX_BATCH
LOOP_INDEX_CHARS = 256 * 1024
"""At most this many messages, and their text to about this many characters, are indexed on
the event loop at once (``index_messages``); more goes on the database thread."""
DELETE_FTS = "INSERT INTO message_text (message_text, rowid, body) VALUES ('delete', ?, ?)"


@frozen
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


def index_pending(conn: sqlite3.Connection) -> int:
    """Index the messages past the mark (those of turns with a chat; ``indexed_text``) and
    move the mark to the newest message, in the caller's transaction; how many went in."""
    return index_some(conn, None)[0]


def index_some(conn: sqlite3.Connection, limit: int | None,
               max_chars: int | None = None) -> tuple[int, bool]:
    """``index_pending`` for at most ``limit`` messages (None: all) and their text up to
    ``max_chars`` (one message at least), the mark moved past the last of them: (how many
    went in, whether more wait)."""
    upto = conn.execute("SELECT indexed_upto FROM search_state WHERE id = 1").fetchone()[0]
    newest = conn.execute("SELECT max(id) FROM messages").fetchone()[0] or 0
    if newest <= upto:
        return 0, False
    found = conn.execute(
        "SELECT m.id, m.body FROM messages m JOIN turns t ON t.id = m.turn_id "
        "WHERE m.id > ? AND m.id <= ? AND t.chat IS NOT NULL "
        "AND m.role IN ('user', 'assistant') ORDER BY m.id LIMIT ?",
        (upto, newest, -1 if limit is None else limit)).fetchall()
    rows: list[tuple[int, str]] = []
    chars = 0
    for n, (i, body) in enumerate(found):
        if max_chars is not None and n and chars > max_chars:
            found = found[:n]
            break
        if (text := indexed_text(load_json(body))) is not None:
            rows.append((i, text))
            chars += len(text)
    more = bool(found) and found[-1][0] < newest and (
        (limit is not None and len(found) == limit) or (max_chars is not None
                                                        and chars > max_chars))
    conn.executemany(INSERT_FTS, rows)
    conn.execute("UPDATE search_state SET indexed_upto = ? WHERE id = 1",
                 (found[-1][0] if more else newest,))
    return len(rows), more


def delete_rows(conn: sqlite3.Connection, turns: list[str]) -> int:
    """Take the indexed messages of ``turns`` out of the FTS5 index (before the messages go:
    each removal is told the text ``indexed_text`` gave at its insert). Turns never indexed
    (no chat) have nothing there, nor messages past the mark (``index_pending``)."""
    marks = ",".join("?" * len(turns))
    found = conn.execute(
        f"SELECT m.id, m.body FROM messages m JOIN turns t ON t.id = m.turn_id "
        f"WHERE m.turn_id IN ({marks}) AND t.chat IS NOT NULL "
        "AND m.role IN ('user', 'assistant') "
        "AND m.id <= (SELECT indexed_upto FROM search_state WHERE id = 1)",
        tuple(turns)).fetchall()
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
    _unindexed = 0
    """Messages this process wrote that wait for the FTS5 index (``index_pending``)."""
    _indexing: asyncio.Task[int] | None = None

    async def ensure_search(self) -> None:
        await self.ensure_schema(FTS_SCHEMA if TRIGRAM else PLAIN_SCHEMA,
                                 postgres=PLAIN_SCHEMA_PG)
        if self.trigram and self.dialect == "sqlite" and await self.columns(OLD_FTS):
            moved = await self._write(_convert_old_index, slow=True)
            _log.info("session search: %d indexed messages moved to the index without copies",
                      moved)
        if self.trigram and self.dialect == "sqlite":
            await self.ensure_schema(SEARCH_STATE)
            await self._write(_open_index, slow=True)  # the mark; what a crash left waiting

    def wrote_unindexed(self, n: int) -> None:
        """(``save_turn``) ``n`` messages wait for the FTS5 index: at ``INDEX_BATCH`` a write
        indexes all that wait, in every process's turns (``index_messages``)."""
        self._unindexed += n
        if self._unindexed >= INDEX_BATCH and (self._indexing is None or self._indexing.done()):
            self._unindexed = 0
            self._indexing = asyncio.get_running_loop().create_task(self._index_soon())

    async def _index_soon(self) -> int:
        try:
            return await self.index_messages()
        except Exception as exc:  # the next batch, a search or the next start tries again
            _log.warning("session search: indexing the newest messages failed: %s", exc)
            return 0

    async def index_messages(self) -> int:
        """Index every message past the mark now (SQLite's FTS5 index; elsewhere nothing
        waits); how many went in.

        A batch of this process's turns (``INDEX_BATCH``) goes in on the event loop's
        connection with the turns' own writes: on the database thread's, its commit would
        empty the loop connection's page cache (SQLite starts a connection's cache afresh
        when another connection wrote), every page read again from the log or the file
        (7.7 reads a turn at 100 chats, 2.8 with the batch on the loop; bench/RESULTS.md,
        round thirteen). A larger backlog (another process's turns, a crash's) goes on the
        thread, so the loop never indexes more than ``LOOP_INDEX_LIMIT`` messages or much
        more than ``LOOP_INDEX_CHARS`` of text at once."""
        if not (self.trigram and self.dialect == "sqlite"):
            return 0
        self._unindexed = 0
        done, more = await self._write(partial(index_some, limit=LOOP_INDEX_LIMIT,
                                               max_chars=LOOP_INDEX_CHARS))
        if more:
            done += await self._write(index_pending, slow=True)
        return done
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
        try:  # what was said a moment ago is found too
            await self.index_messages()
        except (sqlite3.Error, StoreUnavailable) as exc:  # a file it may not write: what is in
            _log.warning("session search: the newest messages are not indexed yet: %s", exc)
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


def _open_index(conn: sqlite3.Connection) -> int:
    """At open: the mark of a database that has none is its newest message (everything
    written before the mark existed went into the index with its turn); then what waits past
    the mark (a crash's leftovers) goes in."""
    conn.execute("INSERT OR IGNORE INTO search_state (id, indexed_upto) "
                 "SELECT 1, coalesce(max(id), 0) FROM messages")
    return index_pending(conn)


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
