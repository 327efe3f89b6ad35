"""The local channel's replies, kept in the database: ``seq`` is durable and monotonic across
restarts, so a client that passes ``next`` back as ``after`` (as the README says) never misses
a reply, and replies not yet read when the gateway stopped are there after the start.

``seq`` is the table's ``AUTOINCREMENT`` key: SQLite never hands out a number twice, even after
old rows are pruned. A reply is written here before the channel reports it delivered (so the
outbox sends it again when this write fails), once per idempotency key. The newest
``MAX_KEPT`` replies are kept; the channel holds the same window in memory for its readers.

Separate from ``local.py`` (the channel, its in-memory window and HTTP handlers) so the
storage reads, and merges, on its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.kernel.events import OutboundMessage, isoformat
from gateway.kernel.store_db import Database, dump_json
from gateway.kernel.store_queues import mark_delivered
from gateway.kernel.store_sql import Migration, TableSet, ordered_seq_ddl, register, twin
from gateway.kernel.values import OutboxMark

MAX_KEPT = 5000
PRUNE_EVERY = 500
"""Rows past ``MAX_KEPT`` are deleted every this many replies (not on each one)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS local_replies (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    record TEXT NOT NULL
);
"""
SCHEMA_PG = SCHEMA.replace("seq INTEGER PRIMARY KEY AUTOINCREMENT", "seq BIGSERIAL PRIMARY KEY")
"""PostgreSQL's twin: the same table, a BIGSERIAL ``seq`` (never handed out twice either)."""
SHARED_PG = ordered_seq_ddl("local_replies", 19001, "parley_local")
"""Several processes write replies (issue 19): ``seq`` is taken under a lock held until the
insert commits, so replies become visible in ``seq`` order (a reader at ``after`` = N never
sees N + 1 before N), and ``NOTIFY parley_local`` (the chat) tells every process's local
channel to read them. SQLite (one process) needs neither."""
TABLES = register(TableSet("local_log", (Migration(1, SCHEMA, SCHEMA_PG),
                                         Migration(2, "", SHARED_PG)), ("local_replies",),
                           generated_ids={"local_replies": "seq"}))
_LAST_SEQ = twin("SELECT seq FROM sqlite_sequence WHERE name = 'local_replies'",
                 "SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
                 "FROM local_replies_seq_seq")


def reply_record(msg: OutboundMessage, text: str, kind: str,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """What the log keeps of a reply to ``msg`` (and a reader is given, with its ``seq``)."""
    created = msg.created_at if msg.created_at.tzinfo else datetime.now(UTC)
    return {"chat_id": msg.chat_id, "text": text, "kind": kind, "reply_to": msg.reply_to,
            "media": [m.to_dict() for m in msg.media],
            "created_at": isoformat(created.astimezone(UTC)),
            "thread_id": msg.thread_id, "turn_id": msg.turn_id, **extra}


def final_extra(msg: OutboundMessage) -> dict[str, Any]:
    """A final reply that ends a live one says which (its ``stream``)."""
    return {"stream": msg.stream, "final": True} if msg.stream is not None else {}


class ReplyLog:
    def __init__(self, store: Database) -> None:
        self._store = store
        self.shared = store.dialect == "postgresql"
        """Other processes write replies too (``newer`` reads theirs)."""

    async def setup(self) -> None:
        await self._store.migrate(TABLES)

    async def load(self, limit: int = MAX_KEPT) -> list[dict[str, Any]]:
        """The newest ``limit`` records, oldest first, each with its ``seq``."""
        rows = await self._store.fetchall(
            "SELECT seq, record FROM local_replies ORDER BY seq DESC LIMIT ?", (limit,))
        return [{"seq": seq, **orjson.loads(record)} for seq, record in reversed(rows)]

    async def newer(self, chat_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        """``chat_id``'s records past ``after`` (the newest ``limit``), oldest first."""
        rows = await self._store.fetchall(
            "SELECT seq, record FROM local_replies WHERE chat_id = ? AND seq > ? "
            "ORDER BY seq DESC LIMIT ?", (chat_id, after, limit))
        return [{"seq": seq, **orjson.loads(record)} for seq, record in reversed(rows)]

    async def last_seq(self) -> int:
        """The highest ``seq`` ever handed out (kept by SQLite even when its row is gone)."""
        row = await self._store.fetchone(_LAST_SEQ)
        return int(row[0]) if row else 0

    async def add(self, key: str, record: dict[str, Any],
                  mark: OutboxMark | None = None) -> tuple[int, bool]:
        """Store ``record`` (without its seq) once per ``key``: ``(seq, True)`` when new, the
        earlier seq and False when ``key`` was stored before. ``mark``: the outbox row marked
        delivered in the same transaction."""
        return await self._store.write(self.writer(key, record, mark))

    @staticmethod
    def writer(key: str, record: dict[str, Any], mark: OutboxMark | None = None
               ) -> Callable[[sqlite3.Connection], tuple[int, bool]]:
        """``add``'s write, for a transaction of the caller's (a turn's: ``TurnSend``)."""
        body = dump_json(record)

        def write(db: sqlite3.Connection) -> tuple[int, bool]:
            # one transaction in one hop to the database thread (it was seven: issue 24)
            if mark is not None:
                mark_delivered(db, mark)
            row = db.execute("SELECT seq FROM local_replies WHERE idempotency_key = ?",
                             (key,)).fetchone()
            if row is not None:  # looked up first: a refused INSERT would use up a number
                return int(row[0]), False
            seq = db.execute(
                "INSERT INTO local_replies (chat_id, idempotency_key, record) VALUES (?, ?, ?)",
                (record["chat_id"], key, body)).lastrowid
            assert seq is not None
            if seq % PRUNE_EVERY == 0:
                db.execute("DELETE FROM local_replies WHERE seq <= ?", (seq - MAX_KEPT,))
            return int(seq), True

        return write
