"""The one SQLite database (WAL) behind sessions, messages, turns and context snapshots.

One aiosqlite connection; writes go through ``transaction()`` under a lock so two concurrent
turns never interleave statements in one transaction. Each message's token count is stored
once, when it is written, and history is read newest-first with a LIMIT, never whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from gateway.kernel.events import InboundMessage, OutboundMessage, event_to_dict, utcnow

_log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    active INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    message_count INTEGER NOT NULL DEFAULT 0,
    last_context_tokens INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS sessions_active_key ON sessions(key) WHERE active = 1;
CREATE INDEX IF NOT EXISTS sessions_key ON sessions(key, id);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id INTEGER NOT NULL REFERENCES sessions(id),
    turn_id TEXT NOT NULL,
    role TEXT NOT NULL,
    body TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_session ON messages(session_id, id);

CREATE TABLE IF NOT EXISTS turns (
    id TEXT PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions(id),
    inbound_id TEXT,
    status TEXT NOT NULL,
    error TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT
);

CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    attempts INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS llm_calls_turn ON llm_calls(turn_id);

CREATE TABLE IF NOT EXISTS context_snapshots (
    turn_id TEXT PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions(id),
    created_at TEXT NOT NULL,
    context_hash TEXT NOT NULL,
    total_tokens INTEGER NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS context_snapshots_session ON context_snapshots(session_id, created_at);

CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    received_at TEXT NOT NULL,
    done_at TEXT,
    UNIQUE (channel, chat_id, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox(id) WHERE status = 'pending';

CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    delivered_at TEXT
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(id) WHERE status = 'pending';

CREATE TABLE IF NOT EXISTS compactions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id INTEGER NOT NULL REFERENCES sessions(id),
    summary TEXT NOT NULL,
    summary_tokens INTEGER NOT NULL,
    first_kept_id INTEGER NOT NULL,
    tokens_before INTEGER NOT NULL,
    messages_summarised INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS compactions_session ON compactions(session_id, id);
"""


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: int
    key: str
    active: bool
    created_at: str
    updated_at: str
    message_count: int
    last_context_tokens: int | None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    turn_id: str
    role: str
    body: dict[str, Any]
    tokens: int


@dataclass(frozen=True, slots=True)
class Compaction:
    """A summary standing in for a session's messages before ``first_kept_id``."""

    id: int
    summary: str
    summary_tokens: int
    first_kept_id: int
    tokens_before: int
    messages_summarised: int


@dataclass(frozen=True, slots=True)
class NewMessage:
    body: dict[str, Any]
    tokens: int


@dataclass(frozen=True, slots=True)
class LLMCallRecord:
    model: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int


def _iso(ts: datetime | None = None) -> str:
    return (ts or utcnow()).isoformat()


def content_text(content: Any) -> str:
    """A message's content as plain text: text parts joined, images as ``[image]``."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "[image]")) for p in content)
    return str(content or "")


def _in_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _json(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _in_channels(channels: list[str] | None) -> tuple[str, tuple[Any, ...]]:
    if channels is None:
        return "", ()
    return f" AND channel IN ({', '.join('?' * len(channels)) or 'NULL'})", tuple(channels)


@dataclass(frozen=True, slots=True)
class PendingOutbound:
    message: OutboundMessage
    attempts: int
    expires_at: datetime


_MARK_DONE = ("UPDATE inbox SET status = 'done', done_at = ? "
              "WHERE channel = ? AND chat_id = ? AND message_id = ?")
_INSERT_OUTBOX = (
    "INSERT OR IGNORE INTO outbox (idempotency_key, channel, chat_id, kind, payload, created_at, "
    "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)")


def _outbox_row(msg: OutboundMessage, expires_at: datetime) -> tuple[Any, ...]:
    return (msg.idempotency_key, msg.channel, msg.chat_id, msg.kind, _json(event_to_dict(msg)),
            _iso(msg.created_at), _iso(expires_at))


_SESSION_COLS = "id, key, active, created_at, updated_at, message_count, last_context_tokens"


def _session(row: Any) -> SessionRow:
    return SessionRow(row[0], row[1], bool(row[2]), row[3], row[4], row[5], row[6])


class Store:
    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._write_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def open(cls, path: Path) -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.execute("PRAGMA busy_timeout=5000")
            await db.executescript(_SCHEMA)
            await db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            await db.close()
            raise
        return cls(db, path)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            async with self._write_lock:
                await self._db.close()

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` as one transaction on the database thread: one thread hop for the whole
        transaction instead of one per statement (the hot path's writes; see bench/).
        Uses aiosqlite's ``_execute``/``_conn`` (the version is pinned)."""
        async with self._write_lock:
            return await self._db._execute(_in_transaction, self._db._conn, fn)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction; everything in it lands or nothing does."""
        async with self._write_lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            else:
                await self._db.execute("COMMIT")

    # sessions -----------------------------------------------------------------------------

    async def active_session(self, key: str) -> SessionRow:
        """The session currently used for ``key``, created on first use."""
        row = await self._fetchone(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE key = ? AND active = 1", (key,))
        if row:
            return _session(row)
        async with self.transaction() as db:
            now = _iso()
            await db.execute(
                "INSERT OR IGNORE INTO sessions (key, active, created_at, updated_at) "
                "VALUES (?, 1, ?, ?)", (key, now, now))
        row = await self._fetchone(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE key = ? AND active = 1", (key,))
        assert row is not None
        return _session(row)

    async def new_session(self, key: str) -> SessionRow:
        """Start a fresh session for ``key``; the old one stays in the database, inactive."""
        async with self.transaction() as db:
            now = _iso()
            await db.execute("UPDATE sessions SET active = 0, updated_at = ? "
                             "WHERE key = ? AND active = 1", (now, key))
            await db.execute("INSERT INTO sessions (key, active, created_at, updated_at) "
                             "VALUES (?, 1, ?, ?)", (key, now, now))
        return await self.active_session(key)

    async def session(self, session_id: int) -> SessionRow | None:
        row = await self._fetchone(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?",
                                   (session_id,))
        return _session(row) if row else None

    async def list_sessions(self, *, include_inactive: bool = False,
                            limit: int = 100) -> list[SessionRow]:
        where = "" if include_inactive else "WHERE active = 1"
        rows = await self._fetchall(
            f"SELECT {_SESSION_COLS} FROM sessions {where} ORDER BY updated_at DESC, id DESC "
            "LIMIT ?", (limit,))
        return [_session(r) for r in rows]

    async def find_session(self, ref: str) -> SessionRow | None:
        """A session by numeric id, or the active session of a key."""
        if ref.isdigit():
            return await self.session(int(ref))
        row = await self._fetchone(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE key = ? ORDER BY active DESC, id DESC "
            "LIMIT 1", (ref,))
        return _session(row) if row else None

    # messages -----------------------------------------------------------------------------

    async def recent_messages(self, session_id: int, limit: int,
                              from_id: int = 0) -> list[StoredMessage]:
        """The newest ``limit`` messages of a session with ids from ``from_id``, oldest
        first. Reads only those rows (the index is on (session_id, id))."""
        rows = await self._fetchall(
            "SELECT id, turn_id, role, body, tokens FROM messages WHERE session_id = ? "
            "AND id >= ? ORDER BY id DESC LIMIT ?", (session_id, from_id, limit))
        return [StoredMessage(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in reversed(rows)]

    async def messages_between(self, session_id: int, first_id: int,
                               last_id: int) -> list[StoredMessage]:
        rows = await self._fetchall(
            "SELECT id, turn_id, role, body, tokens FROM messages WHERE session_id = ? "
            "AND id BETWEEN ? AND ? ORDER BY id", (session_id, first_id, last_id))
        return [StoredMessage(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    # compactions --------------------------------------------------------------------------

    _COMPACTION_COLS = ("id, summary, summary_tokens, first_kept_id, tokens_before, "
                        "messages_summarised")

    async def compaction(self, session_id: int, compaction_id: int | None = None
                         ) -> Compaction | None:
        """The latest compaction of a session (or the one with ``compaction_id``)."""
        if compaction_id is not None:
            row = await self._fetchone(
                f"SELECT {self._COMPACTION_COLS} FROM compactions WHERE id = ? "
                "AND session_id = ?", (compaction_id, session_id))
        else:
            row = await self._fetchone(
                f"SELECT {self._COMPACTION_COLS} FROM compactions WHERE session_id = ? "
                "ORDER BY id DESC LIMIT 1", (session_id,))
        return Compaction(*row) if row else None

    async def add_compaction(self, session_id: int, *, summary: str, summary_tokens: int,
                             first_kept_id: int, tokens_before: int,
                             messages_summarised: int) -> Compaction:
        async with self.transaction() as db:
            cursor = await db.execute(
                "INSERT INTO compactions (session_id, summary, summary_tokens, first_kept_id, "
                "tokens_before, messages_summarised, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session_id, summary, summary_tokens, first_kept_id, tokens_before,
                 messages_summarised, _iso()))
            new_id = cursor.lastrowid
        assert new_id is not None
        return Compaction(new_id, summary, summary_tokens, first_kept_id, tokens_before,
                          messages_summarised)

    async def all_messages(self, session_id: int) -> AsyncIterator[StoredMessage]:
        async with self._db.execute(
                "SELECT id, turn_id, role, body, tokens FROM messages WHERE session_id = ? "
                "ORDER BY id", (session_id,)) as cursor:
            async for r in cursor:
                yield StoredMessage(r[0], r[1], r[2], json.loads(r[3]), r[4])

    async def save_turn(self, *, session_id: int, turn_id: str, inbound_id: str | None,
                        messages: list[NewMessage], status: str = "done",
                        error: str | None = None, calls: list[LLMCallRecord] | None = None,
                        snapshot: dict[str, Any] | None = None,
                        started_at: datetime | None = None,
                        done: list[InboundMessage] | None = None,
                        outbound: list[tuple[OutboundMessage, datetime]] | None = None) -> None:
        """Everything one turn writes, in one transaction: its messages, the inbound messages
        it answered (marked done), and its replies (into the outbox, to be delivered)."""
        now = _iso()
        done_rows = [(now, m.channel, m.chat_id, m.message_id) for m in done or ()]
        outbox_rows = [_outbox_row(m, e) for m, e in outbound or ()]
        message_rows = [(session_id, turn_id, m.body["role"], _json(m.body), m.tokens, now)
                        for m in messages]
        call_rows = [(turn_id, c.model, c.prompt_tokens, c.completion_tokens, c.latency_ms,
                      c.attempts, now) for c in calls or ()]
        total = snapshot.get("total_tokens") if snapshot else None
        snapshot_row = (turn_id, session_id, now, snapshot["hash"], snapshot["total_tokens"],
                        json.dumps(snapshot, ensure_ascii=False)) if snapshot is not None else None

        def write(db: sqlite3.Connection) -> None:
            db.executemany(_MARK_DONE, done_rows)
            db.executemany(_INSERT_OUTBOX, outbox_rows)
            db.executemany(
                "INSERT INTO messages (session_id, turn_id, role, body, tokens, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)", message_rows)
            db.execute(
                "INSERT OR REPLACE INTO turns (id, session_id, inbound_id, status, error, "
                "started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (turn_id, session_id, inbound_id, status, error, _iso(started_at), now))
            db.executemany(
                "INSERT INTO llm_calls (turn_id, model, prompt_tokens, completion_tokens, "
                "latency_ms, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)", call_rows)
            if snapshot_row is not None:
                db.execute(
                    "INSERT OR REPLACE INTO context_snapshots (turn_id, session_id, created_at, "
                    "context_hash, total_tokens, detail) VALUES (?, ?, ?, ?, ?, ?)", snapshot_row)
            db.execute(
                "UPDATE sessions SET message_count = message_count + ?, updated_at = ?, "
                "last_context_tokens = COALESCE(?, last_context_tokens) WHERE id = ?",
                (len(messages), now, total, session_id))

        await self._write(write)

    # inbox --------------------------------------------------------------------------------

    async def inbox_add(self, msg: InboundMessage) -> bool:
        """Store an inbound message; False when this channel message was stored before."""
        row = (msg.channel, msg.chat_id, msg.message_id, _json(event_to_dict(msg)),
               _iso(msg.received_at))
        return await self._write(lambda db: db.execute(
            "INSERT OR IGNORE INTO inbox (channel, chat_id, message_id, payload, received_at) "
            "VALUES (?, ?, ?, ?, ?)", row).rowcount == 1)

    async def finish_inbound(self, done: list[InboundMessage],
                             outbound: list[tuple[OutboundMessage, datetime]]) -> None:
        """Mark inbound messages answered and store the answer, in one transaction."""
        now = _iso()
        done_rows = [(now, m.channel, m.chat_id, m.message_id) for m in done]
        outbox_rows = [_outbox_row(m, e) for m, e in outbound]

        def write(db: sqlite3.Connection) -> None:
            db.executemany(_MARK_DONE, done_rows)
            db.executemany(_INSERT_OUTBOX, outbox_rows)

        await self._write(write)

    async def inbox_pending(self, channels: list[str] | None = None) -> list[InboundMessage]:
        """Messages stored but not answered (the gateway stopped or crashed), oldest first;
        only those of ``channels`` when given (another process may own the rest)."""
        where, params = _in_channels(channels)
        rows = await self._fetchall(
            f"SELECT payload FROM inbox WHERE status = 'pending'{where} ORDER BY id", params)
        return [InboundMessage.from_dict(json.loads(r[0])) for r in rows]

    # outbox -------------------------------------------------------------------------------

    async def outbox_add(self, msg: OutboundMessage, expires_at: datetime) -> None:
        row = _outbox_row(msg, expires_at)
        await self._write(lambda db: db.execute(_INSERT_OUTBOX, row))

    async def outbox_pending(self, channels: list[str] | None = None) -> list[PendingOutbound]:
        where, params = _in_channels(channels)
        rows = await self._fetchall(
            "SELECT payload, attempts, expires_at FROM outbox WHERE status = 'pending'"
            f"{where} ORDER BY id", params)
        return [PendingOutbound(OutboundMessage.from_dict(json.loads(r[0])), r[1],
                                datetime.fromisoformat(r[2])) for r in rows]

    async def outbox_result(self, key: str, *, delivered: bool, attempts: int,
                            error: str | None = None, dead: bool = False) -> None:
        """Record a delivery: delivered, still pending (a failed try), or dead-lettered."""
        status = "delivered" if delivered else ("dead" if dead else "pending")
        row = (status, attempts, error, delivered, _iso(), key)
        await self._write(lambda db: db.execute(
            "UPDATE outbox SET status = ?, attempts = ?, last_error = ?, "
            "delivered_at = CASE WHEN ? THEN ? ELSE delivered_at END "
            "WHERE idempotency_key = ?", row))

    async def outbox_counts(self) -> dict[str, int]:
        rows = await self._fetchall(
            "SELECT status, COUNT(*) FROM outbox WHERE status != 'delivered' GROUP BY status",
            ())
        counts = {"pending": 0, "dead": 0}
        counts.update({r[0]: int(r[1]) for r in rows})
        return counts

    async def dead_letters(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = await self._fetchall(
            "SELECT idempotency_key, channel, chat_id, kind, attempts, last_error, created_at "
            "FROM outbox WHERE status = 'dead' ORDER BY id DESC LIMIT ?", (limit,))
        keys = ("key", "channel", "chat_id", "kind", "attempts", "last_error", "created_at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    # snapshots and usage ------------------------------------------------------------------

    async def latest_snapshot(self, session_id: int) -> dict[str, Any] | None:
        row = await self._fetchone(
            "SELECT detail FROM context_snapshots WHERE session_id = ? "
            "ORDER BY created_at DESC, rowid DESC LIMIT 1", (session_id,))
        return json.loads(row[0]) if row else None

    async def snapshots(self, session_id: int) -> list[dict[str, Any]]:
        """Every turn's snapshot of a session, oldest first (turn N is index N - 1)."""
        rows = await self._fetchall(
            "SELECT detail FROM context_snapshots WHERE session_id = ? "
            "ORDER BY created_at, rowid", (session_id,))
        return [json.loads(r[0]) for r in rows]

    async def usage(self, session_id: int) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) over a session's turns."""
        row = await self._fetchone(
            "SELECT COUNT(*), COALESCE(SUM(c.prompt_tokens), 0), "
            "COALESCE(SUM(c.completion_tokens), 0) FROM llm_calls c "
            "JOIN turns t ON t.id = c.turn_id WHERE t.session_id = ?", (session_id,))
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    async def counts(self) -> dict[str, int]:
        out = {}
        for table in ("sessions", "messages", "turns"):
            row = await self._fetchone(f"SELECT COUNT(*) FROM {table}", ())
            out[table] = int(row[0]) if row else 0
        return out

    # for other modules' tables (pairing, cron, ...) ------------------------------------------

    async def ensure_schema(self, sql: str) -> None:
        """Create a module's tables (``CREATE TABLE IF NOT EXISTS ...``) in the one database."""
        async with self._write_lock:
            await self._db.executescript(sql)

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return await self._fetchone(sql, params)

    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return await self._fetchall(sql, params)

    # helpers ------------------------------------------------------------------------------

    async def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Any:
        rows = await self._db.execute_fetchall(sql, params)  # one thread hop, not three
        return next(iter(rows), None)

    async def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return list(await self._db.execute_fetchall(sql, params))
