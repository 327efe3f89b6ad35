"""Which parts of an outbound message a channel already delivered, kept in SQLite.

A long answer goes out as several platform messages. If the third fails, the delivery worker
retries the whole ``OutboundMessage``; the channel then resumes at the third part instead of
sending the first two again. The record survives a restart, so an outbox entry resent after a
crash (delivered, but not yet marked so) is not delivered twice either.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.kernel.store import Store
from gateway.kernel.store_sql import Migration, TableSet, register

KEEP_SECONDS = 7 * 24 * 3600.0
MAX_CACHED = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS channel_sent_parts (
    channel TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    part INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    sent_at REAL NOT NULL,
    PRIMARY KEY (channel, idempotency_key, part)
);
CREATE INDEX IF NOT EXISTS channel_sent_parts_age ON channel_sent_parts(sent_at);
"""
_SCHEMA_PG = _SCHEMA.replace("REAL", "DOUBLE PRECISION")
"""PostgreSQL's twin: the same table, times DOUBLE PRECISION."""
TABLES = register(TableSet("sent_parts", (Migration(1, _SCHEMA, _SCHEMA_PG),),
                           ("channel_sent_parts",),
                           upsert_keys={"channel_sent_parts": ("channel", "idempotency_key",
                                                               "part")}))



class SentParts:
    def __init__(self, store: Store, channel: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._channel = channel
        self._clock = clock
        self._cache: OrderedDict[str, list[str]] = OrderedDict()

    async def setup(self) -> None:
        """Create the table and forget records older than a week."""
        await self._store.migrate(TABLES)
        async with self._store.transaction() as db:
            await db.execute("DELETE FROM channel_sent_parts WHERE sent_at < ?",
                             (self._clock() - KEEP_SECONDS,))

    async def sent(self, key: str) -> list[str]:
        """Platform message ids of the parts of ``key`` delivered so far, in part order."""
        cached = self._cache.get(key)
        if cached is None:
            rows = await self._store.fetchall(
                "SELECT message_id FROM channel_sent_parts WHERE channel = ? AND "
                "idempotency_key = ? ORDER BY part", (self._channel, key))
            cached = [str(r[0]) for r in rows]
            self._remember(key, cached)
        return list(cached)

    async def record(self, key: str, part: int, message_id: str, chat_id: str) -> None:
        async with self._store.transaction() as db:
            await db.execute(
                "INSERT OR REPLACE INTO channel_sent_parts (channel, idempotency_key, part, "
                "message_id, chat_id, sent_at) VALUES (?, ?, ?, ?, ?, ?)",
                (self._channel, key, part, message_id, chat_id, self._clock()))
        done = self._cache.get(key) or []
        self._remember(key, [*done[:part], message_id])

    def _remember(self, key: str, ids: list[str]) -> None:
        self._cache[key] = ids
        self._cache.move_to_end(key)
        while len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
