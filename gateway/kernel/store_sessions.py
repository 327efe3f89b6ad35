"""Sessions, their messages and compactions, and ``save_turn``: everything a turn reads
before it calls the model and writes when it is done.

Separate from the inbox/outbox (``store_queues``) and the snapshots (``store_snapshots``) so
the conversation's own tables read on their own; ``Store`` (``store.py``) joins them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.frozen import frozen
from gateway.kernel.secrets import SECRETS
from gateway.kernel.snapshot_frame import pack, without_columns
from gateway.kernel.store_db import dump_json, iso, load_json
from gateway.kernel.store_queues import INSERT_DELIVERED, INSERT_OUTBOX, MARK_DONE, outbox_row
from gateway.kernel.store_search import index_statements
from gateway.kernel.store_snapshots import UPSERT_TEXT, LayerTexts
from gateway.kernel.values import TurnSend


@frozen
class SessionRow:
    id: int
    key: str
    active: bool
    created_at: str
    updated_at: str
    message_count: int
    last_context_tokens: int | None


@frozen
class StoredMessage:
    id: int
    turn_id: str
    role: str
    body: dict[str, Any]
    tokens: int


@frozen
class Compaction:
    """A summary standing in for a session's messages before ``first_kept_id``."""

    id: int
    summary: str
    summary_tokens: int
    first_kept_id: int
    tokens_before: int
    messages_summarised: int


@frozen
class NewMessage:
    body: dict[str, Any]
    tokens: int


@frozen
class LLMCallRecord:
    model: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int
    cost: float = 0.0
    kind: str = "chat"
    """``chat`` (a model call of the turn), or a pre-turn media step (``agent/media``):
    ``transcription``, ``vision``, ``document``, ``speech``."""
    audio_seconds: float | None = None
    """Seconds of audio transcribed or spoken, when known."""


@frozen
class UsageTags:
    """Whose a turn's model calls are, for the usage ledger (``llm_calls``)."""

    person: str
    """``channel:sender_id``"""
    chat: str
    """``channel:chat_id``"""
    trust: str
    at: datetime
    """When, by the gateway's clock."""
    day: str
    """``YYYY-MM-DD`` in ``agent.timezone``: the period of daily limits and totals."""


INSERT_CALL = ("INSERT INTO llm_calls (turn_id, model, prompt_tokens, completion_tokens, "
               "latency_ms, attempts, created_at, session_id, person, chat, trust, cost, day, "
               "kind, audio_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _call_rows(session_id: int, turn_id: str, calls: list[LLMCallRecord],
               usage: UsageTags | None, now: str) -> list[tuple[Any, ...]]:
    """``llm_calls`` rows: the usage ledger, tagged with whose the calls were."""
    tags = (usage.person, usage.chat, usage.trust, iso(usage.at), usage.day) if usage \
        else (None, None, None, now, None)
    return [(turn_id, c.model, c.prompt_tokens, c.completion_tokens, c.latency_ms,
             c.attempts, tags[3], session_id, *tags[:3], c.cost, tags[4], c.kind,
             c.audio_seconds) for c in calls]


def _chat_of(session_key: str) -> str | None:
    """``channel:chat_id`` of a conversation's session key; None for a subagent's, a cron
    job's or a heartbeat's own session."""
    channel, _, rest = session_key.partition(":")
    if not rest or channel in ("subagent", "cron", "heartbeat"):
        return None
    return f"{channel}:{rest.split(':', 1)[0]}"


INSERT_MESSAGE = ("INSERT INTO messages (session_id, turn_id, role, body, tokens, created_at) "
                  "VALUES (?, ?, ?, ?, ?, ?)")


UPSERT_TURN = (
    "INSERT INTO turns (id, session_id, inbound_id, status, error, started_at, finished_at, "
    "chat, person) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "session_id = excluded.session_id, inbound_id = excluded.inbound_id, "
    "status = excluded.status, error = excluded.error, started_at = excluded.started_at, "
    "finished_at = excluded.finished_at, chat = COALESCE(excluded.chat, turns.chat), "
    "person = COALESCE(excluded.person, turns.person)")
"""A turn written again keeps the chat and person its indexed messages are found under."""


HELD_SESSIONS = 4096
"""Session ids (and latest compactions) held in memory at most (``SessionTables._held``)."""

_SESSION_COLS = "id, key, active, created_at, updated_at, message_count, last_context_tokens"


def _session(row: Any) -> SessionRow:
    return SessionRow(row[0], row[1], bool(row[2]), row[3], row[4], row[5], row[6])


class SessionTables(LayerTexts):
    """Sessions (one active per key), messages, compactions and a turn's one write."""

    trigram: bool
    """Whether messages are indexed in FTS5 (``SearchTables``, which ``Store`` joins)."""
    wrote_unindexed: Callable[[int], None]
    """(``SearchTables``) Messages written for the FTS5 index's next batch."""

    # what a turn reads of its session, held while nothing else wrote ------------------------

    _held_now: tuple[int, dict[str, int], dict[int, Compaction | None]] | None = None
    """(the version they hold at, session ids by key, latest compactions by session id)."""
    _written_to: tuple[Callable[[int, list[StoredMessage], int], None], ...] = ()
    """Told a turn's messages (session, rows, the version they were written at) once they
    committed on the loop's connection: the history cache adds them unread when nothing else
    was written since its rows (the same version; ``agent/history.py``)."""
    _turn_versions: dict[int, int] | None = None
    """Session id → the version its turn's ``turn_start`` read (``turn_version``)."""

    def _held(self) -> tuple[dict[str, int], dict[int, Compaction | None]] | None:
        """The session ids and latest compactions read before, while they still hold: on
        SQLite, when no other connection wrote since (``_others_version``). Every write that
        starts a session or adds a compaction goes through ``transaction()``, on the database
        thread's connection, so it moves that version as another process's would; the turn's
        own writes (the loop's connection) change neither. One ``PRAGMA`` a turn in place of
        two reads."""
        version = self._others_version()
        if version is None:
            return None
        held = self._held_now
        if held is None or held[0] != version or len(held[1]) > HELD_SESSIONS:
            held = self._held_now = (version, {}, {})
        return held[1], held[2]

    async def turn_start(self, key: str) -> tuple[int, Compaction | None]:
        """What a turn starts from: the id of ``key``'s active session (created on first use)
        and that session's latest compaction; read once while nothing else writes
        (``_held``)."""
        held = self._held()
        ids, compactions = held if held is not None else ({}, {})
        session_id = ids.get(key)
        if session_id is None:
            session_id = ids[key] = (await self.active_session(key)).id
        if held is not None and self._held_now is not None:
            versions = self._turn_versions
            if versions is None or len(versions) >= HELD_SESSIONS:
                versions = self._turn_versions = {}
            versions[session_id] = self._held_now[0]
        if session_id in compactions:
            return session_id, compactions[session_id]
        latest = compactions[session_id] = await self.compaction(session_id)
        return session_id, latest

    def turn_version(self, session_id: int) -> int | None:
        """The version the session's turn started at (``turn_start``), once; or None."""
        versions = self._turn_versions
        return versions.pop(session_id, None) if versions else None

    def tell_messages_written(self, listener: Callable[[int, list[StoredMessage], int], None]
                              ) -> None:
        """``listener`` is told each turn's messages once committed (``_written_to``)."""
        self._written_to = (*self._written_to, listener)

    # sessions -----------------------------------------------------------------------------

    async def active_session(self, key: str) -> SessionRow:
        """The session currently used for ``key``, created on first use."""
        row = await self._fetchone(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE key = ? AND active = 1", (key,))
        if row:
            return _session(row)
        async with self.transaction() as db:
            now = iso()
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
            now = iso()
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
        return [StoredMessage(r[0], r[1], r[2], load_json(r[3]), r[4]) for r in reversed(rows)]

    async def messages_between(self, session_id: int, first_id: int,
                               last_id: int) -> list[StoredMessage]:
        rows = await self._fetchall_thread(
            "SELECT id, turn_id, role, body, tokens FROM messages WHERE session_id = ? "
            "AND id BETWEEN ? AND ? ORDER BY id", (session_id, first_id, last_id))
        return [StoredMessage(r[0], r[1], r[2], load_json(r[3]), r[4]) for r in rows]

    async def backfill_search(self) -> int:
        """Once per database: index the messages written before the search index existed
        (their chat from the session's key, no person: a guest's search does not find them).
        Returns how many were indexed."""
        await self.ensure_schema("CREATE TABLE IF NOT EXISTS search_backfill "
                                 "(done INTEGER NOT NULL)")
        if await self._fetchone("SELECT done FROM search_backfill", ()):
            return 0

        trigram = self.trigram

        def fill(db: sqlite3.Connection) -> int:
            count = 0
            rows = db.execute(
                "SELECT m.id, m.body, s.key, t.chat, t.person, m.turn_id FROM messages m "
                "JOIN sessions s ON s.id = m.session_id LEFT JOIN turns t ON t.id = m.turn_id "
                "WHERE m.role IN ('user', 'assistant') ORDER BY m.id")
            tagged: dict[str, str] = {}
            for batch in iter(lambda: rows.fetchmany(1000), []):
                for message_id, body, key, chat, person, turn_id in batch:
                    # a copy's turns keep whose they were; older rows: the session's chat
                    chat = chat or _chat_of(key)
                    if chat is None:
                        continue
                    sql, index = index_statements([(message_id, json.loads(body))], chat,
                                                  person, trigram)
                    db.executemany(sql, index)
                    count += len(index)
                    if index and turn_id not in tagged:
                        tagged[turn_id] = chat
            db.executemany("UPDATE turns SET chat = ? WHERE id = ? AND chat IS NULL",
                           [(chat, turn) for turn, chat in tagged.items()])
            db.execute("INSERT INTO search_backfill (done) VALUES (1)")
            return count

        return await self._write(fill, slow=True)

    async def last_turn(self, session_id: int) -> tuple[str, str | None] | None:
        """(status, error) of the session's last finished turn (chatter kept as context
        aside), or None before its first."""
        row = await self._fetchone(
            "SELECT status, error FROM turns WHERE session_id = ? AND status != 'context' "
            "ORDER BY finished_at DESC LIMIT 1", (session_id,))
        return (row[0], row[1]) if row else None

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
                 messages_summarised, iso()))
            new_id = cursor.lastrowid
        assert new_id is not None
        return Compaction(new_id, summary, summary_tokens, first_kept_id, tokens_before,
                          messages_summarised)

    async def all_messages(self, session_id: int) -> AsyncIterator[StoredMessage]:
        async for r in self.iterate(
                "SELECT id, turn_id, role, body, tokens FROM messages WHERE session_id = ? "
                "ORDER BY id", (session_id,)):
            yield StoredMessage(r[0], r[1], r[2], load_json(r[3]), r[4])

    async def save_calls(self, *, session_id: int, turn_id: str, calls: list[LLMCallRecord],
                         usage: UsageTags | None) -> None:
        """Model calls made outside a turn's own write (a compaction's): into the ledger."""
        rows = _call_rows(session_id, turn_id, calls, usage, iso())
        await self._write(lambda db: db.executemany(INSERT_CALL, rows))

    async def save_turn(self, *, session_id: int, turn_id: str, inbound_id: str | None,
                        messages: list[NewMessage], status: str = "done",
                        error: str | None = None, calls: list[LLMCallRecord] | None = None,
                        snapshot: dict[str, Any] | None = None, texts: dict[str, str] | None = None,
                        started_at: datetime | None = None,
                        done: list[InboundMessage] | None = None,
                        outbound: list[tuple[OutboundMessage, datetime]] | None = None,
                        usage: UsageTags | None = None,
                        index: tuple[str, str | None] | None = None,
                        sent: TurnSend | None = None) -> None:
        """Everything one turn writes, in one transaction: its messages, the inbound messages
        it answered (marked done), and its replies (into the outbox, to be delivered).
        ``sent``: the reply whose channel sends it in this same transaction (its outbox row
        stored delivered; ``TurnSend.done()`` once it committed, even if the turn was
        cancelled meanwhile: a reply stored is shown).
        ``index``: (chat, person) the messages are found under by ``search_messages``; None:
        not indexed (a subagent's).
        ``texts``: what the snapshot names by content hash, each written once ever."""
        now = iso()
        done_rows = [(now, m.channel, m.chat_id, m.message_id) for m in done or ()]
        outbox_rows = [outbox_row(m, e) for m, e in outbound or ()
                       if sent is None or m.idempotency_key != sent.key]
        delivered_rows = [(*outbox_row(m, e), now) for m, e in outbound or ()
                          if sent is not None and m.idempotency_key == sent.key]
        message_rows = [(session_id, turn_id, m.body["role"], dump_json(m.body), m.tokens, now)
                        for m in messages]
        call_rows = _call_rows(session_id, turn_id, calls or [], usage, now)
        total = snapshot.get("total_tokens") if snapshot else None
        snapshot_row = None
        if snapshot is not None:
            text = SECRETS.redact(dump_json(without_columns(snapshot, turn_id)))
            # PostgreSQL reads it as JSON: kept as text there
            detail: str | bytes = pack(text) if self.dialect == "sqlite" else text
            snapshot_row = (turn_id, session_id, now, snapshot["hash"],
                            snapshot["total_tokens"], detail)
        text_rows, asked = self._new_texts(texts, now)
        trigram = self.trigram

        def write(db: sqlite3.Connection) -> tuple[list[int], int] | None:
            db.executemany(MARK_DONE, done_rows)
            if outbox_rows:
                db.executemany(INSERT_OUTBOX, outbox_rows)
            if sent is not None:
                db.executemany(INSERT_DELIVERED, delivered_rows)
                sent.run(db)
            mine = bool(told) and db is self._now  # told, with this connection's version
            written = None
            if mine or (index is not None and not trigram):  # FTS5: indexed in batches
                version = int(db.execute("PRAGMA data_version").fetchone()[0]) if mine else 0
                inserts = [db.execute(INSERT_MESSAGE, row) for row in message_rows]  # then
                ids = [cur.lastrowid or 0 for cur in inserts]  # read: PostgreSQL pipelines
                written = (ids, version) if mine else None
                if index is not None and not trigram:
                    db.executemany(*index_statements(list(zip(
                        ids, [m.body for m in messages], strict=True)), *index, trigram))
            else:
                db.executemany(INSERT_MESSAGE, message_rows)
            db.execute(UPSERT_TURN, (turn_id, session_id, inbound_id, status, error,
                                     iso(started_at), now, *(index or (None, None))))
            db.executemany(INSERT_CALL, call_rows)
            if text_rows:
                db.executemany(UPSERT_TEXT, text_rows)
            if snapshot_row is not None:
                db.execute(
                    "INSERT OR REPLACE INTO context_snapshots (turn_id, session_id, created_at, "
                    "context_hash, total_tokens, detail) VALUES (?, ?, ?, ?, ?, ?)", snapshot_row)
            db.execute(
                "UPDATE sessions SET message_count = message_count + ?, updated_at = ?, "
                "last_context_tokens = COALESCE(?, last_context_tokens) WHERE id = ?",
                (len(messages), now, total, session_id))
            return written

        def committed(written: tuple[list[int], int] | None) -> None:
            if sent is not None:  # first: a reply stored is shown, whatever follows
                sent.done()
            if written is not None and told:
                ids, version = written
                rows = [StoredMessage(i, turn_id, row[2], load_json(row[3]), row[4])
                        for i, row in zip(ids, message_rows, strict=True)]
                for listener in told:
                    listener(session_id, rows, version)

        told = self._written_to if self.dialect == "sqlite" else ()
        await self._write(write, then=committed)
        self._wrote_texts(text_rows, asked)
        if index is not None and trigram:
            self.wrote_unindexed(len(message_rows))

