"""The store's own tables, in both dialects side by side: ``SCHEMA`` (SQLite) and its twin
``SCHEMA_PG`` (PostgreSQL), the ``CORE`` table set that ``Database.open`` migrates to, and the
upgrade of SQLite databases from before versions were recorded.

A change to these tables is a new ``Migration`` in ``CORE`` with both dialects' DDL (see
docs/architecture.md, "Adding a table").
"""

from __future__ import annotations

import aiosqlite

from gateway.kernel.store_sql import Migration, TableSet, postgres_ddl, register

SCHEMA_VERSION = 1

SCHEMA = """
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
CREATE INDEX IF NOT EXISTS turns_session ON turns(session_id, finished_at);

CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    attempts INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    session_id INTEGER,
    person TEXT,
    chat TEXT,
    trust TEXT,
    cost REAL NOT NULL DEFAULT 0,
    day TEXT,
    kind TEXT NOT NULL DEFAULT 'chat',
    audio_seconds REAL
);
CREATE INDEX IF NOT EXISTS llm_calls_turn ON llm_calls(turn_id);

CREATE TABLE IF NOT EXISTS limit_notices (
    scope TEXT NOT NULL,
    period TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (scope, period)
);

CREATE TABLE IF NOT EXISTS conversation_models (
    session_key TEXT PRIMARY KEY,
    alias TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS context_snapshots (
    turn_id TEXT PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions(id),
    created_at TEXT NOT NULL,
    context_hash TEXT NOT NULL,
    total_tokens INTEGER NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS context_snapshots_session ON context_snapshots(session_id, created_at);

CREATE TABLE IF NOT EXISTS layer_texts (
    hash TEXT PRIMARY KEY,
    text TEXT NOT NULL
) WITHOUT ROWID;

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

SCHEMA_PG = postgres_ddl(SCHEMA).replace(
    "    detail TEXT NOT NULL\n);", "    detail TEXT NOT NULL,\n    seq BIGSERIAL\n);")
"""PostgreSQL's twin of ``SCHEMA``: BIGSERIAL for AUTOINCREMENT, BIGINT and DOUBLE PRECISION
for SQLite's INTEGER and REAL, timestamps kept as ISO text (compared as text, as on SQLite);
``context_snapshots.seq`` stands in for SQLite's ``rowid`` order."""

TURN_TAGS = """
ALTER TABLE turns ADD COLUMN chat TEXT;
ALTER TABLE turns ADD COLUMN person TEXT;
"""
"""Version 2: whose a turn was, for session search (``store_search``): the chat
(``channel:chat_id``) and the person it was for (``channel:sender_id``); both NULL for a turn
whose messages are not indexed (a subagent's, a cron job's own). Kept once per turn, where the
search index used to copy them (and each message's text) into every row of its own."""

TEXTS_TOUCHED = """
ALTER TABLE layer_texts ADD COLUMN touched_at TEXT;
UPDATE layer_texts SET touched_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now');
"""
TEXTS_TOUCHED_PG = """
ALTER TABLE layer_texts ADD COLUMN IF NOT EXISTS touched_at TEXT;
UPDATE layer_texts SET touched_at =
    to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"');
"""
"""Version 3: when a layer text was last written (``store_snapshots.TOUCH_EVERY``), so that
retention can remove the texts no kept snapshot names (``store_retention.sweep_texts``) without
racing a turn that names one. The texts already there count as written now; a row without it
(written by an older version) is never removed."""

CORE = register(TableSet(
    "core", (Migration(1, SCHEMA, SCHEMA_PG), Migration(2, TURN_TAGS, TURN_TAGS),
             Migration(3, TEXTS_TOUCHED, TEXTS_TOUCHED_PG)),
    tables=("sessions", "messages", "turns", "llm_calls", "limit_notices",
            "conversation_models", "context_snapshots", "layer_texts", "inbox", "outbox",
            "compactions"),
    upsert_keys={"turns": ("id",), "context_snapshots": ("turn_id",),
                 "schema_versions": ("component",)},
    generated_ids={"sessions": "id", "messages": "id", "llm_calls": "id", "inbox": "id",
                   "outbox": "id", "compactions": "id"}))
"""The store's own tables. A change to them is a new ``Migration`` here (both dialects)."""

VERSIONS = """
CREATE TABLE IF NOT EXISTS schema_versions (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    applied_at TEXT NOT NULL
);
"""


LEDGER_COLUMNS = {"session_id": "INTEGER", "person": "TEXT", "chat": "TEXT", "trust": "TEXT",
                   "cost": "REAL NOT NULL DEFAULT 0", "day": "TEXT",
                   "kind": "TEXT NOT NULL DEFAULT 'chat'", "audio_seconds": "REAL"}
"""Columns added since the first ledger: ``kind`` and ``audio_seconds`` came with the media
steps (``agent/media``), whose costs are kept beside the model calls."""
LEDGER_INDEXES = """
CREATE INDEX IF NOT EXISTS llm_calls_person_day ON llm_calls(person, day);
"""


async def upgrade_sqlite(db: aiosqlite.Connection) -> None:
    """Databases from before the usage ledger or the media steps: the columns added to
    ``llm_calls`` (older rows have no person, chat or day, cost 0, and are ``chat`` calls)."""
    columns = {row[1] for row in await db.execute_fetchall("PRAGMA table_info(llm_calls)")}
    for name, kind in LEDGER_COLUMNS.items():
        if name not in columns:
            await db.execute(f"ALTER TABLE llm_calls ADD COLUMN {name} {kind}")
    await db.executescript(LEDGER_INDEXES)
